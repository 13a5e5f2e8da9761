//! Hostile journals: replay runs on every open of an image that needs
//! recovery, so a damaged journal is as much hostile input as a damaged
//! inode. Images whose journals hold real transactions (written by
//! debugfs' journal writer and by the kernel, with revokes, escapes,
//! fast commits and an uncommitted tail) are mutated where the journal
//! lives — its superblock fields, log block headers, descriptor tags,
//! revoke counts, commit blocks, fast-commit records, and the filesystem
//! superblock's journal fields — and each mutated image is opened
//! read-only (replay into memory, then a whole-tree walk) and read-write
//! (replay on disk, orphan cleanup): never a panic, never a hang, bounded
//! memory. `EXT4KIT_JOURNAL_FUZZ_COUNT` sets the number of cases.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ext4kit::{Fs, OpenOptions};
use ext4kit_blockdev::{BlockDevice, MemDevice};
use ext4kit_fuzz::alloc::GuardedAlloc;
use ext4kit_fuzz::mutate::Edit;
use ext4kit_fuzz::{
    guarded, run_cases_with, run_image, BaseImage, BaseSpec, CampaignConfig, Mutation, StructureMap, TreeOpts,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[global_allocator]
static ALLOC: GuardedAlloc = GuardedAlloc;

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn work() -> PathBuf {
    let w = std::env::temp_dir().join(format!("ext4kit-hostile-journals-{}", std::process::id()));
    std::fs::create_dir_all(&w).unwrap();
    w
}

/// An image whose journal debugfs filled: three committed transactions
/// (blocks, then revokes of them, then more blocks) and an uncommitted one.
fn debugfs_journal(dir: &Path, name: &str, mkfs: &[&str]) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    sh(Command::new("mke2fs").args(["-q", "-F"]).args(mkfs).arg(&img).arg("8M"));
    let cmds = dir.join(format!("{name}.cmd"));
    std::fs::write(
        &cmds,
        "jo\njw -b 300,301,302 /dev/zero\njc\njo\njw -r 300,302\njc\njo\njw -b 303,304 /dev/zero\njc\njo\njw -b 305 /dev/zero\n",
    )
    .unwrap();
    sh(Command::new("debugfs").arg("-w").arg("-f").arg(&cmds).arg(&img));
    img
}

/// An image the kernel left needing recovery, with fast commits.
fn kernel_journal(dir: &Path) -> PathBuf {
    if let Err(e) = ext4kit_testkit::kernel_available() {
        panic!("this test needs root and loop mounts to make a kernel-written journal: {e}");
    }
    let img = dir.join("kernel.img");
    sh(Command::new("mke2fs").args(["-q", "-F", "-t", "ext4", "-O", "fast_commit", "-b", "1024"]).arg(&img).arg("16M"));
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = ext4kit_testkit::LoopMount::mount(&img, &mnt, "ext4", false).unwrap();
    std::fs::create_dir(mnt.join("d")).unwrap();
    for i in 0..30 {
        std::fs::write(mnt.join(format!("d/f{i}")), vec![i as u8; 3000]).unwrap();
    }
    std::fs::remove_file(mnt.join("d/f3")).unwrap();
    std::fs::rename(mnt.join("d/f4"), mnt.join("d/g4")).unwrap();
    sh(Command::new("sync").arg("-f").arg(mnt.join("d")));
    let f = std::fs::File::create(mnt.join("d/late")).unwrap();
    std::io::Write::write_all(&mut &f, &[9u8; 5000]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let copy = dir.join("kernel-copy.img");
    sh(Command::new("cp").arg("--sparse=always").arg(&img).arg(&copy));
    m.unmount().unwrap();
    copy
}

/// A base and where its journal's blocks are (byte offsets, in journal
/// order), for aiming edits.
struct JBase {
    base: BaseImage,
    journal_blocks: Vec<u64>,
    block_size: usize,
}

fn jbases() -> &'static [JBase] {
    static B: OnceLock<Vec<JBase>> = OnceLock::new();
    B.get_or_init(|| {
        let dir = work();
        let imgs = vec![
            ("csum-v3", debugfs_journal(&dir, "csum-v3", &["-t", "ext4", "-b", "4096"])),
            ("ext3-1k", debugfs_journal(&dir, "ext3-1k", &["-t", "ext3", "-b", "1024"])),
            ("kernel-fc", kernel_journal(&dir)),
        ];
        imgs.into_iter()
            .map(|(name, p)| {
                let bytes = std::fs::read(&p).unwrap();
                let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_vec_read_only(bytes.clone()));
                let j = ext4kit::ext4::journal::open_journal(&dev).unwrap_or_else(|e| panic!("{name}: {e}"));
                let journal_blocks: Vec<u64> = (0..j.total_len).filter_map(|b| j.device_offset(b)).collect();
                let map = StructureMap::build(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
                JBase {
                    block_size: j.block_size,
                    journal_blocks,
                    base: BaseImage {
                        spec: BaseSpec { name, mkfs_args: &[], size_mib: 0, dir_index: true, tree: TreeOpts::FUZZ },
                        bytes: Arc::new(bytes),
                        map,
                        path: p,
                    },
                }
            })
            .collect()
    })
}

fn bases() -> &'static [BaseImage] {
    static B: OnceLock<Vec<BaseImage>> = OnceLock::new();
    B.get_or_init(|| jbases().iter().map(|j| j.base.clone()).collect())
}

/// One mutation aimed at the journal of base `seed % 3`.
fn mutation(seed: u64) -> Mutation {
    let bases = jbases();
    let bi = (seed % bases.len() as u64) as usize;
    let jb = &bases[bi];
    let img = &jb.base.bytes;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut edits = Vec::new();
    let bs = jb.block_size;
    let mut edit = |off: usize, new: Vec<u8>, what: String| {
        if off + new.len() <= img.len() {
            edits.push(Edit { offset: off, old: img[off..off + new.len()].to_vec(), new, what });
        }
    };
    let values = |rng: &mut StdRng| -> u32 {
        match rng.random_range(0..6) {
            0 => 0,
            1 => 1,
            2 => u32::MAX,
            3 => rng.random_range(0..2048),
            4 => 0xC03B_3998,
            _ => rng.random(),
        }
    };
    for _ in 0..rng.random_range(1..=4) {
        let jsb = jb.journal_blocks[0] as usize;
        match rng.random_range(0..7) {
            0 => {
                // A journal superblock field (big-endian words 0x0..0x60).
                let off = jsb + 4 * rng.random_range(0..24);
                edit(off, values(&mut rng).to_be_bytes().to_vec(), "journal superblock word".into());
            }
            1 | 2 => {
                // A header word of a log block near the start of the log.
                let j = rng.random_range(1..40.min(jb.journal_blocks.len()));
                let off = jb.journal_blocks[j] as usize + 4 * rng.random_range(0..4);
                edit(off, values(&mut rng).to_be_bytes().to_vec(), format!("log block {j} header"));
            }
            3 => {
                // Anywhere in a log block (tags, revoke records, commit).
                let j = rng.random_range(1..40.min(jb.journal_blocks.len()));
                let off = jb.journal_blocks[j] as usize + rng.random_range(0..bs - 4);
                edit(off, values(&mut rng).to_be_bytes().to_vec(), format!("log block {j} body"));
            }
            4 => {
                // The fast-commit area (the last blocks of the journal).
                let n = jb.journal_blocks.len();
                let j = n - 1 - rng.random_range(0..n.min(300) - 1);
                let off = jb.journal_blocks[j] as usize + rng.random_range(0..64);
                edit(off, (values(&mut rng) as u16).to_le_bytes().to_vec(), format!("fast-commit block {j}"));
            }
            5 => {
                // Bit flip anywhere in the journal.
                let j = rng.random_range(0..jb.journal_blocks.len());
                let off = jb.journal_blocks[j] as usize + rng.random_range(0..bs);
                edit(off, vec![img[off] ^ (1 << rng.random_range(0..8))], format!("journal block {j} bit"));
            }
            _ => {
                // The filesystem superblock's journal fields: s_journal_inum
                // (0xE0), s_jnl_blocks (0x10C..0x150), s_feature_incompat.
                let off = 1024 + [0xE0, 0x10C, 0x110, 0x148, 0x14C, 0x60][rng.random_range(0..6)];
                edit(off, values(&mut rng).to_le_bytes().to_vec(), "superblock journal field".into());
            }
        }
    }
    Mutation {
        seed,
        base: bi,
        base_name: jb.base.spec.name.to_string(),
        edits,
        touched: vec![ext4kit_fuzz::mutate::Touched::Superblock],
        fix_checksums: true,
        truncate_to: None,
    }
}

#[test]
fn damaged_journals_never_panic_hang_or_blow_up_read_only_or_read_write() {
    let n: u64 = std::env::var("EXT4KIT_JOURNAL_FUZZ_COUNT").ok().and_then(|s| s.parse().ok()).unwrap_or(3000);
    let bases = bases();
    let cfg = CampaignConfig { time_limit: Duration::from_secs(20), ..CampaignConfig::default() };
    let exec = Arc::new(move |m: &Mutation, limits: &ext4kit_fuzz::WalkLimits| {
        let img = m.apply(&bases[m.base]);
        let mut r = run_image(img.clone(), limits);
        if r.panic.is_none() {
            // Read-write: replay on "disk" (memory), orphans, then drop
            // (which writes back). Errors are fine; panics are not.
            let rw = guarded(|| {
                let dev = Arc::new(MemDevice::from_vec(img));
                if let Ok(fs) = Fs::open_device(
                    dev,
                    &OpenOptions { read_only: false, cache_budget: 16 << 20, ..Default::default() },
                ) {
                    let _ = fs.read_dir(b"/");
                }
            });
            if let Err(p) = rw {
                r.panic = Some(p);
            }
        }
        r
    });
    let rep = run_cases_with(n, Arc::new(mutation), &cfg, exec);
    eprintln!("{}", rep.summary());
    assert!(rep.is_clean(), "hostile journals: {}", rep.summary());
    // The mutations must reach replay, not bounce off the front door: most
    // cases open (some after a failed or partial replay).
    assert!(
        rep.opened * 2 >= rep.images,
        "only {} of {} mutated journals opened: the campaign is not exercising replay",
        rep.opened,
        rep.images
    );
}
