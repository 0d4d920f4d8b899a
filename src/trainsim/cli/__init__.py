"""The trainsim command line: one module per command, each parse -> compute -> render."""
