//! refract-cluster's integration tests: dispatchers' cluster handles against a real etcd.

mod shared;
