"""Generated from proto/ by scripts/genproto.py. Do not edit."""
