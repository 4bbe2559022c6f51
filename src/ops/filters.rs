//! Who may read `/metrics` and `/debug/trace`: the caller's bearer token is authenticated by a
//! TokenReview and its user authorized by a SubjectAccessReview on the non-resource URL (the
//! request's path) and the verb (its HTTP method, lower-cased), both asked of the apiserver.
//!
//! Counterpart: controller-runtime's `pkg/metrics/filters.WithAuthenticationAndAuthorization`
//! (since v0.16), itself k8s.io/apiserver's delegating authenticator and authorizer as
//! kube-rbac-proxy uses them: 401 without a valid token, 403 for a user not allowed, 500 when the
//! apiserver cannot answer.
//!
//! Decisions are cached ([`AuthConfig`], controller-runtime's TTLs): a token's review for 1 min
//! (either outcome), an allowed access for 5 min, a denied one for 30 s. A scraper every 15-30 s
//! then costs the apiserver about one TokenReview a minute and one SubjectAccessReview per five;
//! a revoked token or RoleBinding stops working within those times, and a newly granted one is
//! refused at most 30 s longer.
//!
//! Differences on purpose: no retry of a failed review (the scraper retries at its next
//! scrape; controller-runtime retries 5 times over about 4 s while the scrape waits); each
//! review is bounded by [`AuthConfig::review_timeout`] (controller-runtime's
//! `TokenAccessReviewTimeout`, 10 s). The caches are bounded ([`super::decision_cache`]).

use std::collections::BTreeMap;
use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube_client::api::{Api, PostParams};

use super::decision_cache::DecisionCache;

/// The caches' lifetimes and sizes, and the reviews' time limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthConfig {
    /// How long a TokenReview's answer is kept, either way; controller-runtime's `CacheTTL`.
    pub token_ttl: Duration,
    /// How long an allowed SubjectAccessReview is kept; controller-runtime's `AllowCacheTTL`.
    pub allow_ttl: Duration,
    /// How long a denied SubjectAccessReview is kept; controller-runtime's `DenyCacheTTL`.
    pub deny_ttl: Duration,
    /// At most this many decisions in each cache.
    pub cache_capacity: usize,
    /// A review not answered within this is a 500.
    pub review_timeout: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            token_ttl: Duration::from_secs(60),
            allow_ttl: Duration::from_secs(5 * 60),
            deny_ttl: Duration::from_secs(30),
            cache_capacity: 4096,
            review_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a request was not let through, and what it is answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No bearer token, or one the apiserver does not authenticate: 401.
    #[error("Unauthorized")]
    Unauthenticated,
    /// The user may not use this verb on this path: 403.
    #[error("Authorization denied for user {user}")]
    Forbidden {
        /// The authenticated user's name.
        user: String,
    },
    /// The apiserver could not answer a review: 500.
    #[error("{what} failed: {problem}")]
    ReviewFailed {
        /// Which review.
        what: &'static str,
        /// What went wrong.
        problem: String,
    },
}

impl Refusal {
    /// The status the caller gets.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Unauthenticated => StatusCode::UNAUTHORIZED,
            Refusal::Forbidden { .. } => StatusCode::FORBIDDEN,
            Refusal::ReviewFailed { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// What a SubjectAccessReview is asked about; its cache key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Access {
    user: String,
    uid: String,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
    path: String,
    verb: String,
}

/// Delegated authentication and authorization, with its caches.
pub struct Authorizer {
    client: kube_client::Client,
    config: AuthConfig,
    /// Token -> the user it authenticates as (`None`: not authenticated).
    tokens: DecisionCache<String, Option<UserInfo>>,
    /// Access -> allowed.
    access: DecisionCache<Access, bool>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Authorizer {
    /// Reviews through `client`, which needs `create` on `tokenreviews`
    /// (authentication.k8s.io) and `subjectaccessreviews` (authorization.k8s.io).
    pub fn new(client: kube_client::Client, config: AuthConfig) -> Self {
        Self {
            client,
            config,
            tokens: DecisionCache::new(config.cache_capacity),
            access: DecisionCache::new(config.cache_capacity),
        }
    }

    /// Lets a request through (`Ok`) or says why not.
    pub async fn check(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        let token = bearer_token(headers).ok_or(Refusal::Unauthenticated)?;
        let user = self.authenticate(token).await?;
        let access = Access {
            user: user.username.clone().unwrap_or_default(),
            uid: user.uid.clone().unwrap_or_default(),
            groups: user.groups.clone().unwrap_or_default(),
            extra: user.extra.clone().unwrap_or_default(),
            path: path.to_owned(),
            verb: method.as_str().to_ascii_lowercase(),
        };
        let allowed = match self.access.get(&access) {
            Some(allowed) => allowed,
            None => {
                let allowed = self.review_access(&access).await?;
                let ttl = if allowed {
                    self.config.allow_ttl
                } else {
                    self.config.deny_ttl
                };
                self.access.insert(access.clone(), allowed, ttl);
                allowed
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(Refusal::Forbidden { user: access.user })
        }
    }

    async fn authenticate(&self, token: &str) -> Result<UserInfo, Refusal> {
        let cached = self.tokens.get(&token.to_owned());
        let user = match cached {
            Some(user) => user,
            None => {
                let user = self.review_token(token).await?;
                self.tokens
                    .insert(token.to_owned(), user.clone(), self.config.token_ttl);
                user
            }
        };
        user.ok_or(Refusal::Unauthenticated)
    }

    async fn review_token(&self, token: &str) -> Result<Option<UserInfo>, Refusal> {
        // `spec.token` is a `String` from Kubernetes 1.36's API on and an `Option<String>`
        // before: `into` fills either, whichever version the program picked (hack/rust/dep-proof
        // builds on 1.35), and is a no-op only on the newer.
        #[allow(clippy::useless_conversion)]
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned().into(),
                audiences: None,
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answered = self
            .bounded("TokenReview", api.create(&PostParams::default(), &review))
            .await?;
        let status = answered.status.unwrap_or_default();
        Ok(match (status.authenticated, status.user) {
            (Some(true), Some(user)) => Some(user),
            _ => None,
        })
    }

    async fn review_access(&self, access: &Access) -> Result<bool, Refusal> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(access.user.clone()),
                uid: Some(access.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(access.groups.clone()),
                extra: Some(access.extra.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(access.path.clone()),
                    verb: Some(access.verb.clone()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answered = self
            .bounded(
                "SubjectAccessReview",
                api.create(&PostParams::default(), &review),
            )
            .await?;
        Ok(answered.status.is_some_and(|s| s.allowed))
    }

    async fn bounded<T>(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<T, kube_client::Error>>,
    ) -> Result<T, Refusal> {
        match tokio::time::timeout(self.config.review_timeout, call).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(Refusal::ReviewFailed {
                what,
                problem: e.to_string(),
            }),
            Err(_) => Err(Refusal::ReviewFailed {
                what,
                problem: format!(
                    "no answer from the apiserver within {:?}",
                    self.config.review_timeout
                ),
            }),
        }
    }
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive, as the apiserver's
/// bearer-token authenticator reads it); `None` if absent, empty or another scheme.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    // apiserver: TestAuthenticateRequest / TestAuthenticateRequestBadValue
    // (pkg/authentication/request/bearertoken).
    #[test]
    fn only_a_non_empty_bearer_token_is_taken() {
        let with = |v: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::AUTHORIZATION, HeaderValue::from_static(v));
            headers
        };
        assert_eq!(bearer_token(&with("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&with("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(&with("Bearer ")), None);
        assert_eq!(bearer_token(&with("Basic dXNlcjpwYXNz")), None);
        assert_eq!(bearer_token(&with("Bearer")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn refusals_map_to_401_403_and_500() {
        assert_eq!(Refusal::Unauthenticated.status(), 401);
        let forbidden = Refusal::Forbidden {
            user: "system:serviceaccount:ns:sa".into(),
        };
        assert_eq!(forbidden.status(), 403);
        assert_eq!(
            forbidden.to_string(),
            "Authorization denied for user system:serviceaccount:ns:sa"
        );
        let failed = Refusal::ReviewFailed {
            what: "TokenReview",
            problem: "connection refused".into(),
        };
        assert_eq!(failed.status(), 500);
    }
}
