//! The NBD codec's decoders on arbitrary bytes: request headers, option headers and
//! INFO/GO payloads.
//!
//! Checks: they never panic; a decoded request re-encodes to the bytes it came from; a
//! decoded option header is within the payload limit; an INFO/GO payload decodes to a name
//! no longer than the protocol's limit, with exactly the info requests the length announced.

#![no_main]

use flashraid_nbd::proto::{self, Decoded};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match proto::decode_request(data) {
        Ok(Decoded::Item(request, used)) => {
            assert_eq!(used, proto::REQUEST_BYTES);
            let mut again = vec![];
            proto::encode_request(&request, &mut again);
            assert_eq!(&again[..], &data[..used]);
        }
        Ok(Decoded::Incomplete) => assert!(data.len() < proto::REQUEST_BYTES),
        Err(_) => {}
    }
    if let Ok(Decoded::Item(header, used)) = proto::decode_option_header(data) {
        assert_eq!(used, proto::OPTION_HEADER_BYTES);
        assert!(header.len <= proto::OPTION_BYTES_MAX);
    }
    if let Some(info) = proto::decode_info_request(data) {
        assert!(info.name.len() <= proto::EXPORT_NAME_BYTES_MAX);
        assert_eq!(data.len(), 4 + info.name.len() + 2 + 2 * info.requests.len());
    }
});
