"""One model of a vLLM V1 replica, shared by the planner, the simulator and the capacity figures."""
