"""Procurement: candidate plans per job and GPU type, purchase and rental offers, the CP-SAT fleet model."""
