//! `ext4kit info --json IMAGE`: the whole stack an image is read through —
//! container format, partition table, LVM2 volume groups, filesystem — as
//! one JSON document for scripts (field names are listed in README.md's
//! "JSON output" section and kept stable; times follow `crate::json`).
//!
//! Each layer is an object in `stack`, outermost first, with a `layer`
//! field naming it: `container`, `partition_table`, `lvm`, `filesystem`.
//! A layer that is absent (a raw file, no table, no PV) is left out; a
//! layer that cannot be read carries an `error` string instead of its
//! facts, so one damaged table does not hide the others.

use ext4kit::{Location, Timestamp};
use serde_json::{json, Map, Value};

use super::Image;
use crate::image::Probe;
use crate::json;

/// Print the stack of `image` as JSON on stdout.
pub fn run(image: &Image, budget: usize) -> Result<(), String> {
    let mut stack = Vec::new();
    if let Ok(disk) = image.disk() {
        if let Some(l) = disk.layer() {
            let details: Map<String, Value> = l.details.iter().map(|(k, v)| (k.replace(' ', "_"), json!(v))).collect();
            stack.push(json!({
                "layer": "container",
                "format": l.format.name(),
                "variant": l.variant,
                "virtual_size": l.virtual_size,
                "details": details,
            }));
        }
    }
    match image.at(Location::Whole).probe() {
        Ok(Probe::Table(d)) => {
            let parts: Vec<Value> = d
                .parts
                .iter()
                .map(|p| {
                    json!({
                        "number": p.part.number,
                        "start": p.part.start,
                        "size": p.part.size,
                        "type": p.part.type_name,
                        "type_id": p.part.type_id.to_string(),
                        "name": p.part.name,
                        "extended": p.part.extended,
                        "filesystem": p.fs.as_ref().map(|(kind, label)| json!({"kind": kind, "label": label})),
                        "problem": p.part.problem,
                        "write_conflict": p.part.write_conflict,
                    })
                })
                .collect();
            stack.push(json!({
                "layer": "partition_table",
                "kind": d.table.kind.to_string(),
                "sector_size": d.table.sector_size,
                "notes": d.table.notes,
                "partitions": parts,
            }));
        }
        Ok(Probe::Filesystem) => {}
        Err(e) => stack.push(json!({"layer": "partition_table", "error": e})),
    }
    if let Ok(disk) = image.disk() {
        match ext4kit::device::vdisk::lvm::disk_volume_groups(disk.device()) {
            Ok(groups) if groups.is_empty() => {}
            Ok(groups) => {
                let vgs: Vec<Value> = groups
                    .iter()
                    .map(|g| {
                        let lvs: Vec<Value> = g
                            .logical_volumes()
                            .iter()
                            .filter(|l| l.visible())
                            .map(|l| {
                                json!({
                                    "name": l.name(),
                                    "size": l.size(),
                                    "segment_types": l.segment_types(),
                                    "stripes": l.stripes(),
                                })
                            })
                            .collect();
                        json!({
                            "name": g.name(),
                            "uuid": g.id(),
                            "extent_size": g.extent_size(),
                            "logical_volumes": lvs,
                            "missing_physical_volumes": g.missing_physical_volumes().iter().map(|(u, _)| u).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                stack.push(json!({"layer": "lvm", "volume_groups": vgs, "selected": image.volume()}));
            }
            Err(e) => stack.push(json!({"layer": "lvm", "error": e.to_string()})),
        }
    }
    let fs = image
        .resolve()
        .and_then(|loc| super::open_fs(&image.at(loc), budget, true).map_err(String::from));
    match fs {
        Ok(fs) => {
            let i = fs.info();
            stack.push(json!({
                "layer": "filesystem",
                "location": image.resolve().map(|l| l.to_string()).unwrap_or_default(),
                "label": i.label,
                "uuid": i.uuid,
                "state": i.state,
                "features": i.features,
                "block_size": i.block_size,
                "inode_size": i.inode_size,
                "blocks": i.blocks,
                "free_blocks": i.free_blocks,
                "reserved_blocks": i.reserved_blocks,
                "inodes": i.inodes,
                "free_inodes": i.free_inodes,
                "groups": i.groups,
                "blocks_per_group": i.blocks_per_group,
                "inodes_per_group": i.inodes_per_group,
                "directory_hash": i.hash_alg,
                "created": json::time(Timestamp { sec: i.mkfs_time, nsec: 0 }),
                "last_written": json::time(Timestamp { sec: i.wtime, nsec: 0 }),
            }));
        }
        Err(e) => stack.push(json!({"layer": "filesystem", "error": e})),
    }
    let doc = json!({"image": image.path.display().to_string(), "stack": stack});
    json::print_document(&doc)
}
