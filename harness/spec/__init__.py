"""docs/spec.md's step decision restated plainly, below both the generator and the judge,
so that neither needs the system under test to know what a step should do."""
