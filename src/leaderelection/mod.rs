//! client-go's `tools/leaderelection` on coordination.k8s.io/v1 Lease.
