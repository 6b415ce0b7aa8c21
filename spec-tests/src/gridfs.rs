//! GridFS bucket entities and their operations (`upload`, `download`, `downloadByName`,
//! `delete`, `find`, `rename`, `drop`), as the unified test format defines them. An upload's
//! `source` is `{"$$hexBytes": "..."}`; a download's result is the file's bytes as binary, which
//! `$$matchesHexBytes` compares.

use std::time::Duration;

use bson::{Bson, Document};
use futures::io::{AsyncReadExt, AsyncWriteExt};
use futures::TryStreamExt;

use crate::mongodb::error::Error as DriverError;
use crate::mongodb::gridfs::GridFsBucket;
use crate::mongodb::options::{GridFsBucketOptions, GridFsFindOptions, GridFsUploadOptions};
use crate::mongodb::Database;

/// The arguments each bucket operation accepts. Anything else is a load error.
pub const ARGUMENTS: &[(&str, &[&str])] = &[
    (
        "upload",
        &[
            "filename",
            "source",
            "chunkSizeBytes",
            "metadata",
            "contentType",
            "disableMD5",
            "timeoutMS",
        ],
    ),
    ("download", &["id", "timeoutMS"]),
    ("downloadByName", &["filename", "revision", "timeoutMS"]),
    ("delete", &["id", "timeoutMS"]),
    (
        "find",
        &[
            "filter",
            "allowDiskUse",
            "batchSize",
            "limit",
            "maxTimeMS",
            "skip",
            "sort",
            "timeoutMS",
        ],
    ),
    ("rename", &["id", "newFilename", "timeoutMS"]),
    ("drop", &["timeoutMS"]),
];

/// Arguments the format allows that the driver has no counterpart for (deprecated in the GridFS
/// specification and absent from the Rust API), and why.
pub const UNHONOURED_ARGUMENTS: &[(&str, &str)] = &[
    (
        "contentType",
        "the Rust driver has no deprecated GridFS contentType option",
    ),
    (
        "disableMD5",
        "the Rust driver never computes GridFS MD5 checksums (no disableMD5 option)",
    ),
];

/// The bucket of a `bucket` entity on `db`, with its `bucketOptions`.
pub fn create(db: &Database, options: Option<&Document>) -> Result<GridFsBucket, String> {
    let mut bucket_options = GridFsBucketOptions::default();
    for (key, value) in options.into_iter().flatten() {
        match key.as_str() {
            "bucketName" => {
                bucket_options.bucket_name = Some(
                    value
                        .as_str()
                        .ok_or_else(|| format!("bucketOptions.bucketName: {value}"))?
                        .to_string(),
                )
            }
            "chunkSizeBytes" => {
                bucket_options.chunk_size_bytes = Some(u32_of(value, "chunkSizeBytes")?)
            }
            "writeConcern" => {
                bucket_options.write_concern = Some(
                    bson::from_bson(value.clone())
                        .map_err(|e| format!("bucketOptions.writeConcern: {e}"))?,
                )
            }
            "readConcern" => {
                bucket_options.read_concern = Some(
                    bson::from_bson(value.clone())
                        .map_err(|e| format!("bucketOptions.readConcern: {e}"))?,
                )
            }
            "timeoutMS" => {
                let timeout = Duration::from_millis(u64::from(u32_of(value, "timeoutMS")?));
                crate::timeouts::set_bucket(&mut bucket_options, Some(timeout))?;
            }
            other => {
                return Err(format!(
                    "bucketOptions.{other}: not supported by the runner"
                ))
            }
        }
    }
    Ok(db.gridfs_bucket(bucket_options))
}

fn u32_of(value: &Bson, what: &str) -> Result<u32, String> {
    let n = match value {
        Bson::Int32(i) => i64::from(*i),
        Bson::Int64(i) => *i,
        Bson::Double(d) if d.fract() == 0.0 => *d as i64,
        other => return Err(format!("{what} must be an integer, got {other}")),
    };
    u32::try_from(n).map_err(|_| format!("{what} out of range: {n}"))
}

fn timeout_of(args: &mut Document) -> Result<Option<Duration>, String> {
    match args.remove("timeoutMS") {
        None => Ok(None),
        Some(v) => Ok(Some(Duration::from_millis(u64::from(u32_of(
            &v,
            "timeoutMS",
        )?)))),
    }
}

fn hex_source(value: Option<Bson>) -> Result<Vec<u8>, String> {
    let hex = value
        .as_ref()
        .and_then(Bson::as_document)
        .and_then(|d| d.get_str("$$hexBytes").ok())
        .ok_or_else(|| format!("upload.source must be {{\"$$hexBytes\": ...}}, got {value:?}"))?;
    if hex.len() % 2 != 0 {
        return Err(format!("upload.source: odd-length hex {hex:?}"));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&hex[i..i + 2], 16)
                .map_err(|_| format!("upload.source: {hex:?} is not hex"))
        })
        .collect()
}

/// The driver's error inside an I/O error of a GridFS stream (the streams implement the
/// `futures` I/O traits, whose errors wrap the driver's), as an application would unwrap it.
fn driver_error(error: std::io::Error) -> DriverError {
    match error
        .into_inner()
        .map(|inner| inner.downcast::<DriverError>())
    {
        Some(Ok(driver)) => *driver,
        Some(Err(other)) => DriverError::custom(other.to_string()),
        None => DriverError::custom("GridFS stream I/O error without a cause"),
    }
}

fn binary(bytes: Vec<u8>) -> Bson {
    Bson::Binary(bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes,
    })
}

/// Runs bucket operation `name` with `args`. The outer `Err` is a runner problem; the inner
/// result is the driver's (a value, or none).
pub async fn run(
    bucket: &GridFsBucket,
    name: &str,
    args: &mut Document,
) -> Result<Result<Option<Bson>, DriverError>, String> {
    let timeout = timeout_of(args)?;
    let id = args.remove("id");
    Ok(match name {
        "upload" => {
            let filename = args
                .remove("filename")
                .and_then(|f| f.as_str().map(str::to_string))
                .ok_or("upload: missing filename")?;
            let source = hex_source(args.remove("source"))?;
            let mut options = GridFsUploadOptions::default();
            if let Some(size) = args.remove("chunkSizeBytes") {
                options.chunk_size_bytes = Some(u32_of(&size, "chunkSizeBytes")?);
            }
            if let Some(metadata) = args.remove("metadata") {
                options.metadata = Some(
                    metadata
                        .as_document()
                        .cloned()
                        .ok_or("upload.metadata must be a document")?,
                );
            }
            crate::timeouts::set_upload(&mut options, timeout)?;
            let upload = async {
                let mut stream = bucket
                    .open_upload_stream(filename)
                    .with_options(options)
                    .await?;
                let id = stream.id().clone();
                stream.write_all(&source).await.map_err(driver_error)?;
                stream.close().await.map_err(driver_error)?;
                Ok::<_, DriverError>(id)
            };
            upload.await.map(Some)
        }
        "download" | "downloadByName" => {
            let read = async {
                let mut stream = if name == "download" {
                    let id = id
                        .clone()
                        .ok_or_else(|| DriverError::custom("download: no id"))?;
                    crate::timeouts::download(bucket.open_download_stream(id), timeout).await?
                } else {
                    let filename = args
                        .get_str("filename")
                        .map_err(|_| DriverError::custom("downloadByName: no filename"))?
                        .to_string();
                    let mut action = bucket.open_download_stream_by_name(filename);
                    if let Ok(revision) = args.get_i32("revision") {
                        action = action.revision(revision);
                    }
                    crate::timeouts::download_by_name(action, timeout).await?
                };
                let mut bytes = Vec::new();
                stream.read_to_end(&mut bytes).await.map_err(driver_error)?;
                Ok::<_, DriverError>(bytes)
            };
            read.await.map(|bytes| Some(binary(bytes)))
        }
        "delete" => {
            let id = id.ok_or("delete: missing id")?;
            crate::timeouts::gridfs_delete(bucket.delete(id), timeout)
                .await
                .map(|()| None)
        }
        "rename" => {
            let id = id.ok_or("rename: missing id")?;
            let new_filename = args
                .get_str("newFilename")
                .map_err(|_| "rename: missing newFilename")?
                .to_string();
            crate::timeouts::gridfs_rename(bucket.rename(id, new_filename), timeout)
                .await
                .map(|()| None)
        }
        "drop" => crate::timeouts::gridfs_drop(bucket.drop(), timeout)
            .await
            .map(|()| None),
        "find" => {
            let filter = args
                .remove("filter")
                .and_then(|f| f.as_document().cloned())
                .unwrap_or_default();
            let mut options = GridFsFindOptions::default();
            for (key, value) in std::mem::take(args) {
                match key.as_str() {
                    "allowDiskUse" => options.allow_disk_use = value.as_bool(),
                    "batchSize" => options.batch_size = Some(u32_of(&value, "batchSize")?),
                    "limit" => options.limit = Some(i64::from(u32_of(&value, "limit")?)),
                    "skip" => options.skip = Some(u64::from(u32_of(&value, "skip")?)),
                    "maxTimeMS" => {
                        options.max_time = Some(Duration::from_millis(u64::from(u32_of(
                            &value,
                            "maxTimeMS",
                        )?)))
                    }
                    "sort" => options.sort = value.as_document().cloned(),
                    other => return Err(format!("find on a bucket: argument {other}")),
                }
            }
            crate::timeouts::set_gridfs_find(&mut options, timeout)?;
            let found = async {
                let cursor = bucket.find(filter).with_options(options).await?;
                let files: Vec<_> = cursor.try_collect().await?;
                let docs = files
                    .into_iter()
                    .map(|f| bson::to_bson(&f).map_err(DriverError::custom))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok::<_, DriverError>(Bson::Array(docs))
            };
            found.await.map(Some)
        }
        other => return Err(format!("operation {other} is not supported on a bucket")),
    })
}
