//! What a program on kubeloop does first, on Kubernetes 1.35: informers for a built-in type and
//! for one of kubeloop's custom resources, and that resource's CRD. Only `cargo check`ed
//! (hack/test): it proves the library builds and its generic code instantiates against
//! k8s-openapi's `v1_35`.

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::core::CustomResourceExt;
use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
use kubeloop::controller::sample::Foo;
use kubeloop::controller::vm::VirtualMachine;

/// Informers for a built-in type and for a custom resource, on one factory.
fn informers(client: kube_client::Client) -> SharedInformerFactory {
    let factory = SharedInformerFactory::new(client, FactoryOptions::default());
    let _config_maps = factory.informer::<ConfigMap>();
    let _foos = factory.informer::<Foo>();
    let _vms = factory.informer::<VirtualMachine>();
    factory
}

fn main() {
    let _ = informers;
    println!("{} {}", Foo::crd_name(), VirtualMachine::crd_name());
}
