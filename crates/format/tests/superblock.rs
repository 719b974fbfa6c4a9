//! Superblock encoding: round trips, the golden image every later version must read, and a
//! decoder that refuses (never panics on) corrupt, truncated or hostile input.

use flashraid_format::superblock::{ArrayState, MemberState, SUPERBLOCK_BYTES, Superblock};
use flashraid_format::{FormatError, NewArray, Uuid, new_array};
use flashraid_layout::Level;
use proptest::prelude::*;

fn uuid(seed: u8) -> Uuid {
    Uuid::from_random_bytes([seed; 16])
}

/// The array behind the golden image. Never change it: the image is what version 1 wrote.
fn golden_array() -> Vec<Superblock> {
    let new = NewArray {
        array_uuid: uuid(0xa1),
        array_name: "golden".to_string(),
        created_at_unix_seconds: 1_795_000_000,
        level: Level::Raid6,
        chunk_bytes: 16384,
        member_uuids: (1..=6).map(uuid).collect(),
        member_sizes_bytes: vec![64 << 20; 6],
        spare_uuids: vec![uuid(0x70)],
        spare_sizes_bytes: vec![80 << 20],
        bitmap_region_bytes: None,
        shards: 2,
        member_data_bytes_max: None,
        tunables: Default::default(),
    };
    new_array(&new).unwrap().1
}

const GOLDEN: &[u8] = include_bytes!("golden/superblock-v1-raid6-member2.bin");

#[test]
fn golden_image_still_decodes() {
    let expected = &golden_array()[2];
    let decoded = Superblock::decode(GOLDEN).expect("version 1 golden image must decode");
    assert_eq!(&decoded, expected);
    assert_eq!(expected.encode().as_slice(), GOLDEN, "version 1 encoding changed");
    assert_eq!(decoded.level, Level::Raid6);
    assert_eq!(decoded.members.len(), 6);
    assert_eq!(decoded.spares.len(), 1);
    assert_eq!(decoded.state, ArrayState::Dirty);
}

/// Rewrites the golden image. Run once, deliberately:
/// `FLASHRAID_WRITE_GOLDEN=1 cargo test -p flashraid-format --test superblock`.
#[test]
fn write_golden_when_asked() {
    if std::env::var_os("FLASHRAID_WRITE_GOLDEN").is_some() {
        let path =
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/superblock-v1-raid6-member2.bin");
        std::fs::write(path, golden_array()[2].encode()).unwrap();
    }
}

#[test]
fn every_device_round_trips() {
    for sb in golden_array() {
        let bytes = sb.encode();
        assert_eq!(Superblock::decode(&bytes).unwrap(), sb);
    }
    let spare = &golden_array()[6];
    assert!(spare.is_spare());
    assert_eq!(spare.slot(6).state, MemberState::Spare);
}

#[test]
fn single_bit_flips_are_caught() {
    let bytes = golden_array()[0].encode();
    for byte in (0..SUPERBLOCK_BYTES).step_by(7) {
        let mut torn = bytes;
        torn[byte] ^= 0x10;
        assert!(Superblock::decode(&torn).is_err(), "flip at byte {byte} accepted");
    }
}

#[test]
fn specific_refusals() {
    let good = golden_array()[0].encode();
    assert_eq!(
        Superblock::decode(&good[..100]).unwrap_err(),
        FormatError::Truncated { len_bytes: 100 }
    );
    assert_eq!(Superblock::decode(&[0u8; 4096]).unwrap_err(), FormatError::NoMagic);
    // A newer version with a valid checksum is refused by version, not misread.
    let mut newer = good;
    newer[8] = 2;
    fix_crc(&mut newer);
    assert_eq!(
        Superblock::decode(&newer).unwrap_err(),
        FormatError::UnsupportedVersion { version: 2 }
    );
    let mut features = good;
    features[16] = 1;
    fix_crc(&mut features);
    assert_eq!(
        Superblock::decode(&features).unwrap_err(),
        FormatError::UnsupportedFeatures { flags: 1 }
    );
    // A valid checksum over nonsense fields: refused by validation.
    let mut level = good;
    level[120] = 4;
    fix_crc(&mut level);
    assert!(matches!(Superblock::decode(&level), Err(FormatError::Invalid { .. })));
    let mut role = good;
    role[154] = 60;
    fix_crc(&mut role);
    assert!(matches!(Superblock::decode(&role), Err(FormatError::Invalid { .. })));
}

fn fix_crc(bytes: &mut [u8; 4096]) {
    let crc = crc32c::crc32c(&bytes[..4092]);
    bytes[4092..].copy_from_slice(&crc.to_le_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..5000)) {
        let _ = Superblock::decode(&bytes);
    }

    /// Mutations of a valid image with the checksum fixed up, so they reach the field checks:
    /// every result is either a refusal or a superblock that re-encodes to the same bytes.
    #[test]
    fn mutated_images_are_refused_or_consistent(
        edits in prop::collection::vec((0usize..4092, any::<u8>()), 1..6)
    ) {
        let mut bytes = golden_array()[1].encode();
        for (at, value) in edits {
            bytes[at] = value;
        }
        fix_crc(&mut bytes);
        if let Ok(sb) = Superblock::decode(&bytes) {
            let again = Superblock::decode(&sb.encode()).unwrap();
            prop_assert_eq!(again, sb);
        }
    }
}

#[test]
fn tunables_round_trip_and_unset_stays_unset() {
    use flashraid_format::superblock::Tunables;
    let mut sb = golden_array().remove(0);
    assert_eq!(sb.tunables, Tunables::default(), "an array created without tunables stores none");
    for t in [
        Tunables { rebuild_rate_mib_per_s: Some(0), ..Default::default() },
        Tunables {
            rebuild_rate_mib_per_s: Some(500),
            scrub_rate_mib_per_s: Some(u32::MAX),
            merge_window_us: Some(150),
            scrub_interval_hours: Some(168),
            rebuild_busy_rate_mib_per_s: Some(200),
            resync_rate_mib_per_s: Some(64),
            shards: Some(4),
            queue_depth: Some(256),
            member_timeout_ms: Some(60_000),
        },
        Tunables { member_timeout_ms: Some(0), ..Default::default() },
        Tunables { scrub_interval_hours: Some(0), ..Default::default() },
        Tunables { queue_depth: Some(0), shards: Some(u32::MAX), ..Default::default() },
    ] {
        sb.tunables = t;
        let back = Superblock::decode(&sb.encode()).unwrap();
        assert_eq!(back.tunables, t, "0 (no limit) must not read back as unset");
        assert_eq!(back, sb);
    }
    // Tunables 5 and later live in bytes that were reserved: an image written before them
    // (zeroes there) reads as "not set".
    sb.tunables = Tunables { merge_window_us: Some(7), ..Default::default() };
    let image = sb.encode();
    assert!(image[3336..3352].iter().all(|&b| b == 0), "unset tunables left bytes behind");
    let back = Superblock::decode(&image).unwrap();
    assert_eq!((back.tunables.shards, back.tunables.queue_depth), (None, None));
    assert_eq!(back.tunables.member_timeout_ms, None);
}

/// The replace record (a spare's entry names the role it is replacing): it round-trips, an
/// older image reads as "no replace", and it is refused anywhere but on one spare entry for
/// a role the table has.
#[test]
fn the_replace_record_round_trips_and_is_refused_where_it_cannot_be() {
    let plain = golden_array()[2].clone();
    assert!(plain.spares.iter().chain(&plain.members).all(|e| e.replacing.is_none()));
    let mut sb = plain.clone();
    sb.spares[0].replacing = Some(4);
    let bytes = sb.encode();
    assert_eq!(Superblock::decode(&bytes).unwrap(), sb);
    // Entry 6 is the spare (after six roles); its flags at byte 17, the role at 18-19.
    let spare_at = 256 + 6 * 48;
    assert_eq!((bytes[spare_at + 17], bytes[spare_at + 18]), (4, 4));
    // The role byte without the flag, the flag on a role's entry, a role past the table.
    let mut stray = plain.encode();
    stray[spare_at + 18] = 1;
    fix_crc(&mut stray);
    assert!(matches!(Superblock::decode(&stray), Err(FormatError::Invalid { .. })));
    let mut on_member = plain.encode();
    on_member[256 + 17] = 4;
    fix_crc(&mut on_member);
    assert!(matches!(Superblock::decode(&on_member), Err(FormatError::Invalid { .. })));
    let mut past = bytes;
    past[spare_at + 18] = 6;
    fix_crc(&mut past);
    assert!(matches!(Superblock::decode(&past), Err(FormatError::Invalid { .. })));
}

/// A name must be usable as a file name in the control directory and on a command line
/// (found by a misuse test: `--name ../x` put the control socket outside `--control-dir`).
#[test]
fn new_array_names_that_would_escape_a_directory_or_read_as_options_are_refused() {
    let with_name = |name: &str| {
        let new = NewArray {
            array_uuid: uuid(0xa1),
            array_name: name.to_string(),
            created_at_unix_seconds: 0,
            level: Level::Raid1,
            chunk_bytes: 16384,
            member_uuids: (1..=2).map(uuid).collect(),
            member_sizes_bytes: vec![64 << 20; 2],
            spare_uuids: vec![],
            spare_sizes_bytes: vec![],
            bitmap_region_bytes: None,
            shards: 1,
            member_data_bytes_max: None,
            tunables: Default::default(),
        };
        new_array(&new).map(|_| ()).map_err(|e| e.to_string())
    };
    for bad in ["", "a/b", "/", "../x", ".", "..", "-x", "--help", "nul\0", &"n".repeat(65)] {
        let e = with_name(bad).unwrap_err();
        assert!(e.starts_with("array name"), "{bad:?}: {e}");
    }
    assert!(with_name("a/b").unwrap_err().contains("must not contain '/'"));
    assert!(with_name("..").unwrap_err().contains("must not be '.' or '..'"));
    assert!(with_name("-x").unwrap_err().contains("must not start with '-'"));
    for good in ["x", "db-1", "...", ".hidden", "a.b", "naïve", &"n".repeat(64)] {
        assert_eq!(with_name(good), Ok(()), "{good:?}");
    }
}
