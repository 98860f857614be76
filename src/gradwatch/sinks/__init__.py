"""Where results go: the terminal report, JSON, and (later) notifications and exports."""
