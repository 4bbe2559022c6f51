//! What the runtime hands each reconcile: its cancellation token and, under leader election,
//! its fence (the leadership term it runs for).
//!
//! Counterpart: controller-runtime passes a `context.Context` to `Reconcile`, which its manager
//! cancels when leadership is lost; kube-runtime passes nothing (a reconcile is a future the
//! controller may drop). Here a reconcile gets both: a token to select on while it awaits, and
//! [`ReconcileContext::check`] to call before each side effect it causes (a container create,
//! a status write), which fails once the term's entitlement is gone *by this process's own
//! clock*, even when the elector task has not run yet (a process resumed after SIGSTOP).
//!
//! It also takes the reconcile's reports of what it wrote ([`ReconcileContext::wrote`]), so
//! that the key's next reconcile waits for its caches to hold them (read-your-writes,
//! `freshness.rs`).
//!
//! Invariant: once [`ReconcileContext::check`] has failed it never succeeds again for the same
//! context (cancellation is permanent and a term never comes back).

use std::sync::Arc;

use kube_client::Resource;
use thiserror::Error;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::freshness::Freshness;
use super::key::ObjectKey;
use crate::leaderelection::LeaderContext;

/// Handed to every reconcile. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ReconcileContext {
    token: CancellationToken,
    term: Option<LeaderTerm>,
    writes: Option<(Arc<Freshness>, ObjectKey)>,
}

/// The leadership term a reconcile runs for.
#[derive(Clone)]
struct LeaderTerm(LeaderContext);

impl std::fmt::Debug for LeaderTerm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderTerm")
            .field("fencing_token", &self.0.fencing_token())
            .finish()
    }
}

/// Why a reconcile may not cause another side effect.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum NotEntitled {
    /// The runtime cancelled this reconcile (leadership is being given up, or the process is
    /// stopping without drain).
    #[error("the reconcile was cancelled")]
    Cancelled,
    /// The leadership term has ended by this process's own clock: its last successful renewal
    /// is older than the renew deadline, or another holder was seen.
    #[error("this process no longer leads")]
    NotLeading,
}

impl ReconcileContext {
    /// A context with no leader election: only `token` can end its entitlement.
    pub fn new(token: CancellationToken) -> Self {
        ReconcileContext {
            token,
            term: None,
            writes: None,
        }
    }

    /// A context for a reconcile run during the leadership term `leader`; `token` should be a
    /// child of the term's token so that the end of the term cancels it.
    pub fn for_term(token: CancellationToken, leader: LeaderContext) -> Self {
        ReconcileContext {
            token,
            term: Some(LeaderTerm(leader)),
            writes: None,
        }
    }

    /// A context that is never cancelled and has no leader election (unit tests, one-off runs).
    pub fn detached() -> Self {
        Self::new(CancellationToken::new())
    }

    /// The token cancelled when this reconcile must stop.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Resolves when this reconcile must stop. Cancel safe.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// Ok while this reconcile may still cause side effects; call it before each one.
    pub fn check(&self) -> Result<(), NotEntitled> {
        if self.token.is_cancelled() {
            return Err(NotEntitled::Cancelled);
        }
        if let Some(LeaderTerm(leader)) = &self.term
            && !leader.still_leading()
        {
            return Err(NotEntitled::NotLeading);
        }
        Ok(())
    }

    /// True if [`Self::check`] passes.
    pub fn is_entitled(&self) -> bool {
        self.check().is_ok()
    }

    /// This context, recording the writes of `key`'s reconcile in `freshness`.
    pub(crate) fn recording_writes(mut self, freshness: Arc<Freshness>, key: ObjectKey) -> Self {
        self.writes = Some((freshness, key));
        self
    }

    /// Reports that this reconcile wrote `obj`; pass the object the apiserver returned (from a
    /// create, update, patch or status write), whose resourceVersion is the write's. The next
    /// reconcile of this key waits until the controller's informer of `W` holds that version
    /// or a newer one (read-your-writes; see [the runtime's docs](super#read-your-writes) for
    /// the guarantee and its limits). Does nothing for a type the controller has no informer
    /// of, or outside a controller's workers.
    pub fn wrote<W: Resource + 'static>(&self, obj: &W) {
        if let Some((freshness, key)) = &self.writes {
            freshness.wrote(key, obj);
        }
    }

    /// The Lease's `leaseTransitions` when this term began, for systems that can compare a
    /// fencing token; `None` without leader election.
    pub fn fencing_token(&self) -> Option<i32> {
        self.term.as_ref().map(|LeaderTerm(l)| l.fencing_token())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_context_stays_entitled_and_a_cancelled_one_never_comes_back() {
        let ctx = ReconcileContext::detached();
        assert_eq!(ctx.check(), Ok(()));
        assert_eq!(ctx.fencing_token(), None);
        let token = CancellationToken::new();
        let ctx = ReconcileContext::new(token.clone());
        assert!(ctx.is_entitled());
        token.cancel();
        assert_eq!(ctx.check(), Err(NotEntitled::Cancelled));
        assert_eq!(ctx.clone().check(), Err(NotEntitled::Cancelled));
    }
}
