//! A backend the agent sends windows to over HTTP (Pyroscope, an OTLP endpoint): each window is
//! cut into series, encoded in the backend's format, gzipped, and handed to an [`Uploader`] on
//! its own thread ([`Delivery`]), which delivers it or keeps it in its spool.

use std::io::Write;

use flate2::{write::GzEncoder, Compression};

use super::delivery::Delivery;
use super::series::{series_of, CgroupPaths, Series, SeriesNaming, ServiceName};
use super::sink::{Window, WindowSink};
use super::upload::{UploadCounts, Uploader};
use super::ExportError;
use crate::scope::kubernetes::KubernetesNames;

/// Encodes a window's series as one request body, before compression.
pub type Encode = fn(&[Series]) -> Result<Vec<u8>, ExportError>;

pub struct BackendSink {
    name: String,
    service_name: ServiceName,
    cgroups: CgroupPaths,
    kubernetes: KubernetesNames,
    encode: Encode,
    delivery: Delivery,
}

impl BackendSink {
    /// `name` is the backend as the user gave it (`--pyroscope URL`).
    pub fn new(
        name: String,
        naming: SeriesNaming,
        encode: Encode,
        uploader: Uploader,
    ) -> Result<BackendSink, ExportError> {
        Ok(BackendSink {
            delivery: Delivery::start(&name, uploader)?,
            name,
            service_name: naming.service_name,
            cgroups: CgroupPaths::new(),
            kubernetes: KubernetesNames::new(&naming.node_root),
            encode,
        })
    }
}

impl WindowSink for BackendSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn export(&mut self, window: &Window) -> Result<(), ExportError> {
        self.cgroups.refresh_for(&window.profile);
        self.kubernetes.start_window();
        let series = series_of(
            &window.profile,
            &self.service_name,
            &self.cgroups,
            &mut self.kubernetes,
        );
        if series.is_empty() {
            // Backends refuse a request without profiles; an idle window has nothing to say.
            return Ok(());
        }
        // As the pprof files: the fastest level (see `write_pprof`).
        let mut gzip = GzEncoder::new(Vec::new(), Compression::fast());
        gzip.write_all(&(self.encode)(&series)?)?;
        self.delivery.send(gzip.finish()?)
    }

    fn delivery(&self) -> Option<UploadCounts> {
        Some(self.delivery.counts())
    }

    fn finish(&mut self) -> Result<(), ExportError> {
        self.delivery.finish()
    }
}
