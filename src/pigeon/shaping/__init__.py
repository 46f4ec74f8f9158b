"""Traffic shaping: rates and limits per destination."""
