//! LVM2 volumes made by the real LVM tools (Debian's lvm2), read and
//! written through `ext4kit_vdisk::lvm`.
//!
//! A GPT disk image with two partitions is attached with `losetup -P`;
//! `pvcreate`, `vgcreate`, `lvcreate` make a VG with a two-segment linear
//! LV and a two-stripe LV; an ext4 made by `mkfs.ext4 -d` is placed in
//! each LV where LVM's own report (`lvs -o seg_pe_ranges`, `pvs -o
//! pe_start`) says its extents are. The loop device is detached, the
//! image opened in Rust (GPT partition → VG → LV), and every byte of each
//! LV compared. Then bytes are written through the LV past the end of its
//! filesystem and across segment and stripe boundaries, flushed, and the
//! image attached again: LVM still accepts the VG (`vgck`), the LV read
//! back where LVM says it is holds our bytes, and `e2fsck -fn` finds each
//! filesystem clean.
//!
//! The host's kernel is not asked to activate the LVs (this build
//! machine's has no device-mapper): LVM runs with `global/activation =
//! 0` and the placement comes from LVM's report. The activation is
//! checked in a VM (ext4kit_testkit::vm, Debian's kernel): after our
//! writes, `vgchange -ay` there, each `/dev/VG/LV` is copied whole onto a
//! second disk and compared with what we wrote, and e2fsck finds each
//! filesystem clean on the activated LV.
//!
//! Every LVM command sees only this test's loop partitions (a `devices`
//! filter, no devices file), keeps no backup or archive, and the VG name
//! is unique; a guard undoes everything even when the test fails. The
//! test needs root, loop devices, the tools and the VM kernel
//! (`.ci/vm-kernel`), and fails saying which is missing rather than pass
//! without checking anything.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use ext4kit_blockdev::partition::{open_location, Location};
use ext4kit_blockdev::{BlockDevice, FileDevice};
use ext4kit_testkit::lvm::{e2fsck_clean, filesystem, run, Lab, Layout, CREATE_INACTIVE};
use ext4kit_vdisk::lvm::{physical_volume, volume_groups};

const MIB: u64 = 1 << 20;

#[test]
fn lvm_tools_volumes_read_and_written() {
    let mut lab = Lab::new("rw");
    std::fs::File::create(&lab.image).unwrap().set_len(64 * MIB).unwrap();
    let img = lab.image.to_str().unwrap().to_string();
    run("sgdisk", &["-n1:2048:+24M", "-t1:8e00", "-n2:0:+24M", "-t2:8e00", &img]);
    lab.attach();
    let (p1, p2) = (lab.part(1), lab.part(2));
    let vg = lab.vg.clone();
    lab.lvm(&["pvcreate", "-y", &p1, &p2]);
    lab.lvm(&["vgcreate", "-y", "-s", "1m", &vg, &p1, &p2]);
    // lin: 6 MiB on PV 1, then str takes 4 MiB of each PV, then lin grows
    // by 6 MiB onto PV 2: two linear segments on different PVs.
    let create = &CREATE_INACTIVE;
    let mut a = vec!["lvcreate", "-L", "6m", "-n", "lin"];
    a.extend_from_slice(create);
    a.extend_from_slice(&[&vg, &p1]);
    lab.lvm(&a);
    let mut a = vec!["lvcreate", "-L", "8m", "-i", "2", "-I", "64k", "-n", "str"];
    a.extend_from_slice(create);
    a.push(&vg);
    lab.lvm(&a);
    lab.lvm(&["lvextend", "-L", "12m", &format!("{vg}/lin"), &p2]);

    let lin_layout = Layout::of(&lab, "lin");
    let str_layout = Layout::of(&lab, "str");
    assert_eq!(
        lin_layout.segs.len(),
        2,
        "lin should have two segments: {:?}",
        lin_layout.segs
    );
    assert_eq!(
        str_layout.segs[0].ranges.len(),
        2,
        "str should have two stripes: {:?}",
        str_layout.segs
    );
    let p2_uuid = lab
        .lvm(&["pvs", "--noheadings", "-o", "pv_uuid", &p2])
        .trim()
        .to_string();

    // Each LV holds an ext4 smaller than the LV; the rest is a pattern.
    let mut lin_bytes = filesystem(&lab, "lin", 7 * MIB, 12 * MIB);
    let mut str_bytes = filesystem(&lab, "str", 5 * MIB, 8 * MIB);
    lin_layout.put(&lab, &lin_bytes);
    str_layout.put(&lab, &str_bytes);
    lab.detach();

    // Rust: the GPT partitions, their labels, the VG, the LVs.
    {
        let disk: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&lab.image, true).unwrap());
        let mut devs = vec![("disk".to_string(), disk.clone())];
        for n in 1..=2 {
            devs.push((
                format!("partition {n}"),
                open_location(disk.clone(), Location::Partition(n)).unwrap(),
            ));
        }
        assert!(physical_volume(devs[0].1.as_ref()).unwrap().is_none());
        let pv2 = physical_volume(devs[2].1.as_ref())
            .unwrap()
            .expect("partition 2 is a PV");
        assert_eq!(pv2.uuid(), p2_uuid);

        // With partition 2 left out, str (on both PVs) is refused naming it.
        let vgs = volume_groups(&devs[..2]).unwrap();
        let e = vgs[0].open("str", false).unwrap_err();
        assert!(e.to_string().contains(&p2_uuid), "{e}");

        let vgs = volume_groups(&devs).unwrap();
        assert_eq!(vgs.len(), 1);
        let g = &vgs[0];
        assert_eq!(g.name(), vg);
        assert_eq!(g.extent_size(), MIB);
        let names: Vec<_> = g
            .logical_volumes()
            .iter()
            .map(|l| (l.name().to_string(), l.size()))
            .collect();
        assert_eq!(names, [("lin".to_string(), 12 * MIB), ("str".to_string(), 8 * MIB)]);

        for (name, expect) in [("lin", &lin_bytes), ("str", &str_bytes)] {
            let lv = g.open(name, false).unwrap();
            assert_eq!(lv.size(), expect.len() as u64);
            let mut got = vec![0u8; expect.len()];
            lv.read_at(0, &mut got).unwrap();
            let first_diff = got.iter().zip(expect.iter()).position(|(a, b)| a != b);
            assert!(first_diff.is_none(), "{name}: first difference at byte {first_diff:?}");
            // Odd-sized reads across every boundary agree too.
            let mut off = 0u64;
            while off < lv.size() {
                let n = (lv.size() - off).min(77_777);
                let mut b = vec![0u8; n as usize];
                lv.read_at(off, &mut b).unwrap();
                assert_eq!(&b[..], &expect[off as usize..(off + n) as usize], "{name} at {off}");
                off += n;
            }
        }

        // Write past each filesystem: across lin's segment boundary (6 MiB,
        // PV 1 → PV 2) and across str's 64 KiB chunks.
        let lin = g.open("lin", true).unwrap();
        let st = g.open("str", true).unwrap();
        let patch: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8 ^ 0x5a).collect();
        let write = |lv: &ext4kit_vdisk::lvm::LogicalVolume, bytes: &mut Vec<u8>, at: u64| {
            lv.write_at(at, &patch).unwrap();
            bytes[at as usize..at as usize + patch.len()].copy_from_slice(&patch);
        };
        write(&lin, &mut lin_bytes, 6 * MIB - 100_000);
        write(&lin, &mut lin_bytes, 12 * MIB - 300_000);
        write(&st, &mut str_bytes, 5 * MIB + 12_345);
        lin.flush().unwrap();
        st.flush().unwrap();
    }

    // The image again in the kernel: LVM accepts the VG unchanged, and
    // where LVM says the LVs are, our bytes are.
    lab.attach();
    lab.lvm(&["vgck", &vg]);
    assert_eq!(lin_layout.get(&lab, 12 * MIB), lin_bytes, "lin after our writes");
    assert_eq!(str_layout.get(&lab, 8 * MIB), str_bytes, "str after our writes");
    e2fsck_clean(&lab, "lin", &lin_bytes);
    e2fsck_clean(&lab, "str", &str_bytes);

    // A kernel with device-mapper activates the VG as LVM does and reads
    // each LV whole onto a second disk: lin at 0, str at 16 MiB.
    let copy = lab.dir.join("copy.img");
    std::fs::File::create(&copy).unwrap().set_len(24 * MIB).unwrap();
    let script = format!(
        "section activate lvm vgchange -ay {vg}\n\
         section sizes sh -c 'blockdev --getsize64 /dev/{vg}/lin; blockdev --getsize64 /dev/{vg}/str'\n\
         section fsck-lin e2fsck -fn /dev/{vg}/lin\n\
         section fsck-str e2fsck -fn /dev/{vg}/str\n\
         section copy-lin dd if=/dev/{vg}/lin of=/dev/vdb bs=1M conv=notrunc\n\
         section copy-str dd if=/dev/{vg}/str of=/dev/vdb bs=1M seek=16 conv=notrunc\n\
         section deactivate lvm vgchange -an {vg}\n"
    );
    let vm = lab.boot_vm(&[&copy], &script);
    let ok = |name: &str| vm.section_ok(name).unwrap_or_else(|e| panic!("{e}"));
    ok("activate");
    assert_eq!(ok("sizes"), format!("{}\n{}\n", 12 * MIB, 8 * MIB));
    ok("fsck-lin");
    ok("fsck-str");
    ok("copy-lin");
    ok("copy-str");
    ok("deactivate");
    let copied = std::fs::read(&copy).unwrap();
    for (name, at, expect) in [("lin", 0, &lin_bytes), ("str", 16 * MIB as usize, &str_bytes)] {
        let got = &copied[at..at + expect.len()];
        let first_diff = got.iter().zip(expect.iter()).position(|(a, b)| a != b);
        assert!(
            first_diff.is_none(),
            "{name} as the VM's device-mapper reads it differs from what we wrote, first at byte {first_diff:?}"
        );
    }
}

/// The committed text's place in the metadata area at byte 4096 of `part`
/// (the first `raw_locn`), and the area's size.
fn first_mda_text(part: &str) -> (u64, u64, u64) {
    let mut h = [0u8; 512];
    std::fs::File::open(part).unwrap().read_exact_at(&mut h, 4096).unwrap();
    let le = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap());
    (le(40), le(48), le(32))
}

#[test]
fn wrapped_metadata_and_a_second_copy_at_the_end() {
    let mut lab = Lab::new("wrap");
    std::fs::File::create(&lab.image).unwrap().set_len(64 * MIB).unwrap();
    let img = lab.image.to_str().unwrap().to_string();
    run("sgdisk", &["-n1:2048:+24M", "-t1:8e00", "-n2:0:+24M", "-t2:8e00", &img]);
    lab.attach();
    let (p1, p2) = (lab.part(1), lab.part(2));
    let vg = lab.vg.clone();
    // A 60 KiB metadata area at the start and another at the end of PV 1.
    lab.lvm(&[
        "pvcreate",
        "-y",
        "--dataalignment",
        "64k",
        "--metadatasize",
        "16k",
        "--pvmetadatacopies",
        "2",
        &p1,
    ]);
    lab.lvm(&["vgcreate", "-y", &vg, &p1, &p2]);
    let create = &CREATE_INACTIVE;
    let mut a = vec!["lvcreate", "-L", "4m", "-n", "lin"];
    a.extend_from_slice(create);
    a.extend_from_slice(&[&vg, &p1]);
    lab.lvm(&a);
    // Long tags make each commit's text ~1 KiB longer, so the circular
    // buffer wraps after a few.
    let long = "x".repeat(1000);
    let mut wrapped = false;
    for i in 0..30 {
        lab.lvm(&["lvchange", "--addtag", &format!("t{i}{long}"), &format!("{vg}/lin")]);
        let (offset, size, area) = first_mda_text(&p1);
        if offset + size > area {
            wrapped = true;
            break;
        }
    }
    assert!(wrapped, "the metadata never wrapped round its area");
    let seqno: u64 = lab
        .lvm(&["vgs", "--noheadings", "-o", "vg_seqno", &vg])
        .trim()
        .parse()
        .unwrap();
    let layout = Layout::of(&lab, "lin");
    let data: Vec<u8> = (0..4 * MIB).map(|i| (i * 7 % 255) as u8).collect();
    layout.put(&lab, &data);
    lab.detach();

    let disk: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&lab.image, true).unwrap());
    let devs: Vec<(String, Arc<dyn BlockDevice>)> = (1..=2)
        .map(|n| {
            (
                format!("partition {n}"),
                open_location(disk.clone(), Location::Partition(n)).unwrap(),
            )
        })
        .collect();
    let pv1 = physical_volume(devs[0].1.as_ref()).unwrap().unwrap();
    let mdas = pv1.metadata_areas().to_vec();
    assert_eq!(mdas.len(), 2);
    assert!(mdas[1].offset() > 20 * MIB, "the second copy is at the end: {mdas:?}");
    let check = || {
        let vgs = volume_groups(&devs).unwrap();
        assert_eq!(vgs[0].seqno(), seqno);
        let lv = vgs[0].open("lin", false).unwrap();
        let mut got = vec![0u8; data.len()];
        lv.read_at(0, &mut got).unwrap();
        assert!(got == data, "lin differs");
    };
    check();

    // Damage the first copy's wrapped tail (just after the area's header):
    // the copy at the end still serves.
    let p1dev = &devs[0].1;
    let mut b = [0u8; 1];
    p1dev.read_at(mdas[0].offset() + 512 + 5, &mut b).unwrap();
    p1dev.write_at(mdas[0].offset() + 512 + 5, &[b[0] ^ 0x20]).unwrap();
    check();
    // With both damaged the PV's metadata is an error naming the device.
    let (offset, _, _) = {
        let mut h = [0u8; 512];
        p1dev.read_at(mdas[1].offset(), &mut h).unwrap();
        let le = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap());
        (le(40), le(48), le(32))
    };
    p1dev.write_at(mdas[1].offset() + offset + 3, b"#").unwrap();
    let e = volume_groups(&devs).unwrap_err();
    assert!(
        e.to_string().contains("partition 1: lvm2: metadata area") && e.to_string().contains("checksum"),
        "{e}"
    );
}
