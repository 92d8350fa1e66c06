"""Measured runs against predictions: calibration rows read into scenarios, and the scores."""
