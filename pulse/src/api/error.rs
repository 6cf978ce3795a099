//! [`ApiError`], what every handler returns on failure (a JSON [`ErrorBody`] with a
//! status), and the query-parameter checks that produce it.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use models::TenantId;

use super::{ErrorBody, owned};
use crate::fleet::Coverage;
use crate::heat::QueryError;
use crate::partition::Partitions;

/// An error a handler returns; it becomes a JSON [`ErrorBody`].
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
    /// Boxed: an error travels in every handler's `Result`, and must stay small.
    pub(super) coverage: Option<Box<Coverage>>,
}

impl ApiError {
    pub(super) fn prediction_off() -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: "prediction_off",
            message: "prediction is off in this pulse (started with --no-prewarm)".into(),
            coverage: None,
        }
    }

    pub(super) fn owner_unavailable(route: &[i32], partitions: &Partitions) -> Self {
        let list: Vec<String> = route.iter().map(i32::to_string).collect();
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "owner_unavailable",
            message: format!(
                "partitions [{}], which may hold the key, are not assigned to this instance",
                list.join(", ")
            ),
            coverage: Some(Box::new(owned(partitions))),
        }
    }

    /// The same refusal, saying which partitions were asked.
    pub(super) fn covering(self, coverage: Coverage) -> Self {
        ApiError {
            coverage: Some(Box::new(coverage)),
            ..self
        }
    }

    pub(super) fn bad(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code,
            message: message.into(),
            coverage: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_owned(),
            message: self.message,
            coverage: self.coverage.map(|c| *c),
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> Self {
        let code = match e {
            QueryError::UnknownTenant(_) => "unknown_tenant",
            QueryError::UnknownRegion(_) => "unknown_region",
        };
        ApiError {
            status: StatusCode::NOT_FOUND,
            code,
            message: e.to_string(),
            coverage: None,
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        ApiError::bad("bad_parameter", e.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> Self {
        ApiError::bad("bad_parameter", e.body_text())
    }
}

pub(super) fn tenant_param(value: &str) -> Result<TenantId, ApiError> {
    TenantId::new(value).map_err(|e| ApiError::bad("invalid_tenant", format!("tenant: {e}")))
}

/// A `tenant` query parameter that must be present.
pub(super) fn required_tenant(value: Option<&str>) -> Result<TenantId, ApiError> {
    tenant_param(value.ok_or_else(|| ApiError::bad("bad_parameter", "tenant: required"))?)
}

/// A count query parameter (`name`): `default` when absent, else within `1..=max`.
pub(super) fn count_param(
    name: &str,
    value: Option<usize>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let n = value.unwrap_or(default);
    if !(1..=max).contains(&n) {
        return Err(ApiError::bad(
            "bad_parameter",
            format!("{name}: {n} is not in 1..={max}"),
        ));
    }
    Ok(n)
}
