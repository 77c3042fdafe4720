"""What a configuration may hold, declared where it is read (constraints on constructor parameters)."""
