"""History: what each rank decided and did, as plain frozen data that worlds hand back and
checkers read. Nothing here runs a rank or judges one."""
