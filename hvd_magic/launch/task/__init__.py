"""What runs inside each Spark barrier task on an executor: the task's body and mpirun's exec agent."""
