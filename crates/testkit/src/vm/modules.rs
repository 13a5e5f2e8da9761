//! Which kernel module files a VM must load, and in what order.
//!
//! `modules.dep` (written by depmod) has one line per module file,
//! `kernel/path/name.ko: dependency.ko ...`, paths relative to
//! `lib/modules/RELEASE`; `modules.builtin` lists the modules compiled
//! into the kernel, which need no loading. A module's name is its file
//! name without `.ko`, with `-` and `_` the same (`dm-mod` is `dm_mod`),
//! as modprobe treats them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::util::Context;

/// Module name → (file relative to the modules directory, its dependencies).
type DepMap = BTreeMap<String, (String, Vec<String>)>;

/// The files to `insmod` for `names` and everything they need, each after
/// its dependencies. Modules built into the kernel are left out; a name
/// the kernel has neither as a module nor built in is an error naming it.
pub fn load_order(modules_dir: &Path, names: &[&str]) -> io::Result<Vec<PathBuf>> {
    let deps = read_dep(modules_dir)?;
    let builtin = read_builtin(modules_dir)?;
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for name in names {
        let name = module_name(name);
        if builtin.contains(&name) {
            continue;
        }
        if !deps.contains_key(&name) {
            return Err(io::Error::other(format!(
                "kernel module {name} is neither in {} nor built in",
                modules_dir.join("modules.dep").display()
            )));
        }
        visit(&deps, &name, &mut seen, &mut order);
    }
    Ok(order.into_iter().map(|rel| modules_dir.join(rel)).collect())
}

fn visit(deps: &DepMap, name: &str, seen: &mut BTreeSet<String>, order: &mut Vec<String>) {
    if !seen.insert(name.to_string()) {
        return;
    }
    let Some((file, needs)) = deps.get(name) else {
        return;
    };
    for need in needs {
        visit(deps, need, seen, order);
    }
    order.push(file.clone());
}

/// `dm-mod`, `dm_mod`, `kernel/drivers/md/dm-mod.ko` → `dm_mod`.
fn module_name(s: &str) -> String {
    let base = s.rsplit('/').next().unwrap_or(s);
    let base = base.split(".ko").next().unwrap_or(base);
    base.replace('-', "_")
}

fn read_dep(modules_dir: &Path) -> io::Result<DepMap> {
    let path = modules_dir.join("modules.dep");
    let text = fs::read_to_string(&path).context(|| format!("read {}", path.display()))?;
    let mut map = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some((file, needs)) = line.split_once(':') else {
            return Err(io::Error::other(format!("{}: no ':' in {line:?}", path.display())));
        };
        let needs = needs.split_whitespace().map(module_name).collect();
        map.insert(module_name(file), (file.to_string(), needs));
    }
    Ok(map)
}

fn read_builtin(modules_dir: &Path) -> io::Result<BTreeSet<String>> {
    let path = modules_dir.join("modules.builtin");
    let text = fs::read_to_string(&path).context(|| format!("read {}", path.display()))?;
    Ok(text.lines().filter(|l| !l.trim().is_empty()).map(module_name).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_come_first_and_builtins_are_left_out() {
        let dir = std::env::temp_dir().join(format!("ext4kit-modules-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("modules.dep"),
            "kernel/drivers/virtio/virtio_ring.ko:\n\
             kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko\n\
             kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n\
             kernel/drivers/md/dm-mod.ko:\n",
        )
        .unwrap();
        fs::write(dir.join("modules.builtin"), "kernel/fs/ext4/ext4.ko\n").unwrap();
        let order = load_order(&dir, &["virtio_blk", "dm-mod", "ext4", "virtio"]).unwrap();
        let rel: Vec<_> = order
            .iter()
            .map(|p| p.strip_prefix(&dir).unwrap().to_str().unwrap().to_string())
            .collect();
        assert_eq!(
            rel,
            [
                "kernel/drivers/virtio/virtio_ring.ko",
                "kernel/drivers/virtio/virtio.ko",
                "kernel/drivers/block/virtio_blk.ko",
                "kernel/drivers/md/dm-mod.ko",
            ]
        );
        let e = load_order(&dir, &["no_such"]).unwrap_err();
        assert!(e.to_string().contains("no_such"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
