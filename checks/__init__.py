"""kvspec checks."""
