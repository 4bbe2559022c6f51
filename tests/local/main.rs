//! The tests that start no control plane: the library's layering read from its sources,
//! the workqueue's hand-off model-checked with loom, the sample controller's signal handling
//! against an in-test HTTP server, and the Docker-API engine (podman) the VM controller
//! drives. One test binary (as cargo's own suite is), so the dependency graph is linked once.
//!
//! They share no process-global state: no cluster, no tracing subscriber, no environment
//! variable or resource limit they set (`ops_accept_backoff` lowers the process's
//! `RLIMIT_NOFILE`, so it keeps a binary of its own).

mod docker_engine;
mod layering;
mod sample_controller_signals;
mod workqueue_loom;
