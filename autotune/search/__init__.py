"""What the study searches and judges by: the space, the two references, the objective. Its
modules: ARCHITECTURE.md."""
