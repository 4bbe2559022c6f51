//! `kubeloop::protobuf::fuzz_envelope` under libFuzzer (what it checks is said there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubeloop::protobuf::fuzz_envelope(data));
