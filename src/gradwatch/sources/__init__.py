"""Where log bytes come from: archived files (plain or gzip), and the paths a user named."""
