//! The CSI Controller service, reduced to the one call that describes it. Volumes are buckets that
//! already exist (static provisioning), so there is nothing to create, attach or snapshot, and the plugin
//! capabilities do not announce a controller: kubelet and the sidecars never call it. It is served
//! because conformance tools (csi-sanity) ask every plugin for its controller capabilities before they
//! test the node service. Every other controller call keeps the generated default: Unimplemented.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::csi;
use crate::csi::controller_service_capability::{Rpc, Type, rpc};
use crate::service::Driver;

/// What the controller capabilities say: no RPC beyond this one, and the single-node writer modes,
/// which the node service mounts read-write (a capability about access modes, not an RPC to serve).
fn capabilities() -> Vec<csi::ControllerServiceCapability> {
    vec![csi::ControllerServiceCapability {
        r#type: Some(Type::Rpc(Rpc {
            r#type: rpc::Type::SingleNodeMultiWriter as i32,
        })),
    }]
}

#[tonic::async_trait]
impl csi::controller_server::Controller for Arc<Driver> {
    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: capabilities(),
        }))
    }
}
