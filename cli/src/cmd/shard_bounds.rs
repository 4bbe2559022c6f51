//! `kubeloop shard-bounds`: where to cut a namespace-hash shard ring so that each shard holds
//! an equal share of a resource's objects, as they are now. It counts the objects per
//! namespace (a paged metadata-only LIST) and prints the bounds for the controllers'
//! `--shard-bounds` on stdout (`kubeloop::cache::ShardBounds::of_namespaces`), and on stderr
//! what each shard then holds. Every replica of a ring must be given the same bounds.

use std::collections::BTreeMap;

use anyhow::Context;
use kube_client::api::{Api, ApiResource, DynamicObject, ListParams};
use kubeloop::cache::{ShardBounds, fnv1a_64};

use super::common::ClusterArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// How many shards (the ring's --shards).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub shards: u32,
    /// The resource whose objects are counted, by its plural name (the controller's primary
    /// resource: foos for the sample controller, virtualmachines for the VM controller).
    #[arg(long, default_value = "configmaps")]
    pub resource: String,
    /// The resource's API version, group/version (v1 for the core group), e.g.
    /// samplecontroller.k8s.io/v1alpha1.
    #[arg(long, default_value = "v1")]
    pub api_version: String,
    /// Count only the objects with these labels (a label selector, as kubectl's -l).
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    let (group, version) = args
        .api_version
        .split_once('/')
        .unwrap_or(("", &args.api_version));
    let resource = ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: args.api_version.clone(),
        kind: String::new(),
        plural: args.resource.clone(),
    };
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let mut params = ListParams::default().limit(500);
    if let Some(selector) = &args.selector {
        params = params.labels(selector);
    }
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    loop {
        let page = api
            .list_metadata(&params)
            .await
            .with_context(|| format!("listing {} ({})", args.resource, args.api_version))?;
        for item in &page.items {
            let namespace = item.metadata.namespace.clone().unwrap_or_default();
            *counts.entry(namespace).or_default() += 1;
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let bounds =
        ShardBounds::of_namespaces(counts.iter().map(|(ns, n)| (ns.as_str(), *n)), args.shards)
            .with_context(|| format!("cutting {} into {} shards", args.resource, args.shards))?;
    let mut per_shard = vec![(0u64, 0usize); args.shards as usize];
    for (namespace, n) in &counts {
        let shard = &mut per_shard[bounds.index_of(fnv1a_64(namespace.as_bytes())) as usize];
        shard.0 += n;
        shard.1 += 1;
    }
    eprintln!(
        "{} {} in {} namespaces, cut into {} shards:",
        counts.values().sum::<u64>(),
        args.resource,
        counts.len(),
        args.shards
    );
    for (shard, (objects, namespaces)) in per_shard.iter().enumerate() {
        eprintln!("  shard {shard}: {objects} objects in {namespaces} namespaces");
    }
    println!("{bounds}");
    Ok(())
}
