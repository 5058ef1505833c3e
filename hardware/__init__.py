"""Hardware and model specs, the roofline cost model and the memory planner. Pure Python + numpy."""
