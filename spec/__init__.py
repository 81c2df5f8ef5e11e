"""kvspec executable spec."""
