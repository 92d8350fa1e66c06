"""Many scenarios at once: scenario files and folders walked, each planned (in worker processes
when there are enough), one row per plan or per invalid or infeasible scenario, as a DataFrame."""
