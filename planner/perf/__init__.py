"""Time and cost of a job: FLOPs, utilisation, pipeline bubble, communication, offload."""
