//! `kubeloop::cache::fuzz_protobuf_list` under libFuzzer (what it checks is said there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubeloop::cache::fuzz_protobuf_list(data));
