"""The default sim world, its rank threads in a forked runner process of their own."""
