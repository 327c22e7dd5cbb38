//! refract-lab's integration tests, one binary (the modules are listed in the next commit).
