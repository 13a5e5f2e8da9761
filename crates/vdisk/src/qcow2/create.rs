//! A new, empty qcow2 v3 image, made by imago's creation code (header,
//! one refcount table and block for the first clusters, then an L1 table
//! grown to cover the disk), then opened as a [`Qcow2Disk`].
//!
//! Rules relied on (qcow2 spec, "Header" and "Host cluster management"):
//! the cluster size is a power of two from 512 bytes to 2 MiB; every L2
//! table is one cluster of 8-byte entries, so one L1 entry maps
//! `cluster_size / 8` clusters; qemu (and imago) cap the L1 table at
//! 32 MiB (4 Mi entries), which bounds the disk at
//! `4 Mi * cluster_size / 8 * cluster_size` bytes (2 PiB at 64 KiB).

use std::io;
use std::sync::Arc;

use imago::qcow2::Qcow2;
use imago::FormatCreateBuilder;

use super::storage::DevStorage;
use super::{said, Qcow2Disk, FORMAT};
use crate::sizing::{invalid, unit_or};
use crate::{BlockDevice, NamedFiles};

/// qemu's (and imago's) default cluster size.
const DEFAULT_CLUSTER: u64 = 64 << 10;
/// The most L1 entries qemu reads (`QCOW_MAX_L1_SIZE` / 8).
const MAX_L1_ENTRIES: u64 = 4 << 20;

/// The largest disk a qcow2 of `cluster`-byte clusters can address.
fn max_size(cluster: u64) -> u64 {
    MAX_L1_ENTRIES * (cluster / 8) * cluster
}

/// Create a `size`-byte qcow2 (size already whole sectors) in the empty
/// `file`, with clusters of `cluster` bytes (default 64 KiB).
pub(crate) fn create(file: Arc<dyn BlockDevice>, size: u64, cluster: Option<u64>) -> io::Result<Qcow2Disk> {
    let cluster = unit_or(FORMAT, cluster, DEFAULT_CLUSTER, 512..=2 << 20, "cluster size")?;
    let max = max_size(cluster);
    if size > max {
        return Err(invalid(
            FORMAT,
            format_args!("a disk of {size} bytes is over the {max} bytes {cluster}-byte clusters can address"),
        ));
    }
    // imago writes the header last (after the refcount structures it
    // points at), then grows the L1 table to the size and flushes.
    Qcow2::<DevStorage>::create_builder(DevStorage::new(file.clone(), None))
        .cluster_size(cluster as usize)
        .size(size)
        .create()
        .map_err(said)?;
    file.flush()?;
    Qcow2Disk::open(file, None, true, &NamedFiles::none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DiskImage;
    use ext4kit_blockdev::MemDevice;

    #[test]
    fn a_new_image_has_the_size_and_reads_zeros_then_what_was_written() {
        let file = Arc::new(MemDevice::growable(Vec::new()));
        let disk = create(file.clone(), (64 << 20) + 512, None).unwrap();
        assert_eq!(disk.size(), (64 << 20) + 512);
        let layer = disk.layer();
        assert_eq!(layer.variant, "v3");
        assert!(layer.details.contains(&("cluster size".into(), "65536".into())));
        let mut b = vec![1u8; 4096];
        disk.read_at(disk.size() - 4096, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        disk.write_at(disk.size() - 512, &[7u8; 512]).unwrap();
        disk.flush().unwrap();
        drop(disk);
        let again = Qcow2Disk::open(file, None, false, &NamedFiles::none()).unwrap();
        let mut s = [0u8; 512];
        again.read_at(again.size() - 512, &mut s).unwrap();
        assert_eq!(s, [7u8; 512]);
    }

    #[test]
    fn sizes_past_the_l1_limit_and_bad_clusters_are_refused() {
        assert_eq!(max_size(DEFAULT_CLUSTER), 1 << 51);
        let file = Arc::new(MemDevice::growable(Vec::new()));
        let e = create(file.clone(), (1 << 51) + 512, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("can address"), "{e}");
        let e = create(file.clone(), 1 << 20, Some(3000)).unwrap_err();
        assert!(e.to_string().contains("cluster size 3000"), "{e}");
        assert_eq!(file.size(), 0, "nothing written before the request is checked");
    }
}
