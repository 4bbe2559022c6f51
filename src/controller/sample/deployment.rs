//! The Deployment a Foo owns: sample-controller's `newDeployment` (controller.go) and the
//! ownership checks (`metav1.IsControlledBy`, `metav1.GetControllerOf`).
//!
//! The Deployment is named `spec.deploymentName`, in the Foo's namespace, labelled
//! `{app: nginx, controller: <foo name>}` (also its selector and Pod labels), runs one
//! `nginx:latest` container, and carries a controller ownerReference to the Foo with
//! `blockOwnerDeletion: true`, so deleting the Foo garbage-collects it and its Pods.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use super::types::{API_VERSION, Foo, KIND};
use crate::runtime::controller_of;

/// The container image of every Foo's Deployment.
pub(crate) const IMAGE: &str = "nginx:latest";

/// The Deployment `foo` asks for. sample-controller: `newDeployment`.
pub fn new_deployment(foo: &Foo) -> Deployment {
    let labels = BTreeMap::from([
        ("app".to_string(), "nginx".to_string()),
        ("controller".to_string(), foo.name().to_string()),
    ]);
    Deployment {
        metadata: ObjectMeta {
            name: Some(foo.spec.deployment_name.clone()),
            namespace: Some(foo.namespace().to_string()),
            owner_references: Some(vec![controller_reference(foo)]),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: foo.spec.replicas,
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "nginx".to_string(),
                        image: Some(IMAGE.to_string()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// A controller ownerReference to `foo`. client-go: `metav1.NewControllerRef`.
pub(crate) fn controller_reference(foo: &Foo) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.to_string(),
        kind: KIND.to_string(),
        name: foo.name().to_string(),
        uid: foo.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether `meta`'s controller is `foo` (same UID). client-go: `metav1.IsControlledBy`.
pub(crate) fn is_controlled_by(meta: &ObjectMeta, foo: &Foo) -> bool {
    match (controller_of(meta), foo.metadata.uid.as_deref()) {
        (Some(owner), Some(uid)) => owner.uid == uid,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::sample::types::FooSpec;

    fn foo() -> Foo {
        let mut foo = Foo::namespaced(
            "ns",
            "example-foo",
            FooSpec {
                deployment_name: "web".into(),
                replicas: Some(3),
            },
        );
        foo.metadata.uid = Some("uid-1".into());
        foo
    }

    #[test]
    fn the_deployment_has_the_name_labels_image_replicas_and_owner_the_foo_asks_for() {
        let d = new_deployment(&foo());
        assert_eq!(d.metadata.name.as_deref(), Some("web"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("ns"));
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        let want = BTreeMap::from([
            ("app".to_string(), "nginx".to_string()),
            ("controller".to_string(), "example-foo".to_string()),
        ]);
        assert_eq!(spec.selector.match_labels.as_ref(), Some(&want));
        assert_eq!(
            spec.template.metadata.as_ref().unwrap().labels.as_ref(),
            Some(&want)
        );
        let containers = &spec.template.spec.as_ref().unwrap().containers;
        assert_eq!(containers.len(), 1);
        assert_eq!(containers[0].image.as_deref(), Some("nginx:latest"));
        let owner = controller_of(&d.metadata).unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Foo", "example-foo", "uid-1")
        );
        assert_eq!(owner.api_version, "samplecontroller.k8s.io/v1alpha1");
        assert_eq!(owner.block_owner_deletion, Some(true));
        assert!(is_controlled_by(&d.metadata, &foo()));
        assert!(crate::runtime::refers_to::<Foo>(owner));
    }

    #[test]
    fn a_deployment_owned_by_another_uid_or_not_as_controller_is_not_controlled_by_the_foo() {
        let f = foo();
        let mut d = new_deployment(&f);
        d.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
        assert!(!is_controlled_by(&d.metadata, &f));
        let mut d = new_deployment(&f);
        d.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false);
        assert!(!is_controlled_by(&d.metadata, &f));
        assert!(controller_of(&d.metadata).is_none());
        d.metadata.owner_references = None;
        assert!(!is_controlled_by(&d.metadata, &f));
    }

    #[test]
    fn an_owner_of_another_group_is_not_a_foo() {
        let mut owner = controller_reference(&foo());
        owner.api_version = "example.com/v1".into();
        assert!(!crate::runtime::refers_to::<Foo>(&owner));
    }
}
