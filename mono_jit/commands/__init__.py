"""What only the CLI reaches, through api.py: doctor, explain, listing and verify."""
