//! Which destinations keel refuses to call, so that an endpoint is never a way into the
//! operator's network: `https://` only (unless `webhooks.allow_http`), no credentials in the
//! URL, and no loopback, private, link-local, multicast, unspecified or otherwise
//! non-public address (unless `webhooks.allow_private_destinations`). A URL is checked when
//! it is saved ([`check_url`]: its scheme, and a literal address or `localhost`); a host
//! name's addresses are checked each time it is called ([`check_addresses`], on the
//! addresses it resolved to then, which the request must then use: DNS may change between
//! the two).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What the operator allows (`[webhooks]`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Rules {
    pub allow_http: bool,
    pub allow_private_destinations: bool,
}

/// Why a destination is refused (the message names the rule, never a secret).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refused {
    #[error("not a valid URL ({0})")]
    Invalid(String),
    #[error("the URL must use https (webhooks.allow_http is off)")]
    NotHttps,
    #[error("the URL must use https or http")]
    Scheme,
    #[error("the URL must name a host")]
    NoHost,
    #[error("the URL must not carry a user name or password")]
    Credentials,
    #[error("{0} is a loopback, private, link-local, multicast, unspecified or reserved address (webhooks.allow_private_destinations is off)")]
    NotPublic(String),
}

macro_rules! url_pattern_tail {
    () => {
        concat!(
            // A host name: letter-digit-hyphen labels, the last beginning with a letter.
            r"(([A-Za-z0-9]+(-[A-Za-z0-9]+)*\.)*[A-Za-z][A-Za-z0-9]*(-[A-Za-z0-9]+)*\.?",
            // A dotted-quad IPv4 address (no leading zeros: the parser reads those as octal).
            r"|((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])",
            // An IPv6 address in brackets, in hexadecimal groups.
            r"|\[(([0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}|([0-9A-Fa-f]{1,4}:){1,7}:",
            r"|([0-9A-Fa-f]{1,4}:){1,6}:[0-9A-Fa-f]{1,4}|([0-9A-Fa-f]{1,4}:){1,5}(:[0-9A-Fa-f]{1,4}){1,2}",
            r"|([0-9A-Fa-f]{1,4}:){1,4}(:[0-9A-Fa-f]{1,4}){1,3}|([0-9A-Fa-f]{1,4}:){1,3}(:[0-9A-Fa-f]{1,4}){1,4}",
            r"|([0-9A-Fa-f]{1,4}:){1,2}(:[0-9A-Fa-f]{1,4}){1,5}|[0-9A-Fa-f]{1,4}:(:[0-9A-Fa-f]{1,4}){1,6}",
            r"|:((:[0-9A-Fa-f]{1,4}){1,7}|:))\])",
            // A port of at most 65535, then printable ASCII after `/`, `?` or `#`.
            r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?",
            r"([/?#][!-~]*)?$"
        )
    };
}

/// What the documents say of a destination URL, and what keel's bound checks hold a body's
/// URL to before [`check_url`] (which takes every URL it admits, whatever its address: the
/// privacy of an address is decided on saving and on calling, and no pattern can say it):
/// the scheme, then a host name of letter-digit-hyphen labels whose last begins with a letter
/// (so the parser never reads it as an address) and without `--` (no punycode label that
/// might not decode), a dotted-quad IPv4 or a bracketed IPv6 address, a port of at most
/// 65535, and printable ASCII after `/`, `?` or `#`. No user name or password.
pub fn url_pattern(allow_http: bool) -> &'static str {
    match allow_http {
        true => concat!(r"^https?://", url_pattern_tail!()),
        false => concat!(r"^https://", url_pattern_tail!()),
    }
}

/// The URL if keel may save it as an endpoint's.
pub fn check_url(raw: &str, rules: Rules) -> Result<url::Url, Refused> {
    let url = url::Url::parse(raw.trim()).map_err(|e| Refused::Invalid(e.to_string()))?;
    match url.scheme() {
        "https" => {}
        "http" if rules.allow_http => {}
        "http" => return Err(Refused::NotHttps),
        _ => return Err(Refused::Scheme),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Refused::Credentials);
    }
    let host = url.host().ok_or(Refused::NoHost)?;
    if rules.allow_private_destinations {
        return Ok(url);
    }
    match host {
        url::Host::Ipv4(ip) => check_addresses(&[IpAddr::V4(ip)], rules)?,
        url::Host::Ipv6(ip) => check_addresses(&[IpAddr::V6(ip)], rules)?,
        // RFC 6761: `localhost` and its subdomains are the loopback, whatever DNS says.
        url::Host::Domain(name) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if name == "localhost" || name.ends_with(".localhost") {
                return Err(Refused::NotPublic(name));
            }
        }
    }
    Ok(url)
}

/// Refuses a host whose resolved addresses include one that is not public (all must be:
/// the request may use any of them).
pub fn check_addresses(addresses: &[IpAddr], rules: Rules) -> Result<(), Refused> {
    if rules.allow_private_destinations {
        return Ok(());
    }
    match addresses.iter().find(|ip| !is_public(**ip)) {
        Some(ip) => Err(Refused::NotPublic(ip.to_string())),
        None => Ok(()),
    }
}

/// A globally routable unicast address: not loopback, private, shared (CGNAT), link-local,
/// multicast, broadcast, unspecified, documentation, benchmarking or reserved, in IPv4 or
/// IPv6, including IPv4 addresses carried inside IPv6 (mapped, compatible, NAT64, 6to4).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_unspecified()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || a >= 240) // reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    let embedded_v4 = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    // IPv4-compatible (deprecated) ::a.b.c.d, but not :: or ::1 (handled below).
    if segments[..6].iter().all(|s| *s == 0) && (segments[6] != 0 || segments[7] > 1) {
        return is_public_v4(embedded_v4(segments[6], segments[7]));
    }
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) reach the IPv4 address inside them.
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(embedded_v4(segments[6], segments[7]));
    }
    if segments[0] == 0x2002 {
        return is_public_v4(embedded_v4(segments[1], segments[2]));
    }
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || segments[..3] == [0x64, 0xff9b, 1] // local-use NAT64 64:ff9b:1::/48
        || segments[..2] == [0x2001, 0] // Teredo 2001::/32
        || segments[..3] == [0x2001, 2, 0] // benchmarking 2001:2::/48
        || (segments[0] == 0x2001 && (segments[1] & 0xfff0) == 0x0010) // ORCHID 2001:10::/28
        || (segments[0] == 0x2001 && (segments[1] & 0xfff0) == 0x0020) // ORCHIDv2 2001:20::/28
        || (segments[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (segments[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (segments[0] & 0xffc0) == 0xfec0 // site-local (deprecated) fec0::/10
        || (segments[0] == 0x2001 && segments[1] == 0x0db8) // documentation
        || segments[0] == 0x0100 && segments[1..4] == [0, 0, 0]) // discard-only 100::/64
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRICT: Rules = Rules {
        allow_http: false,
        allow_private_destinations: false,
    };

    #[test]
    fn only_public_unicast_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.1",
            "198.18.0.1",
            "240.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::10.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
            "fec0::1",
            "100::1",
            "64:ff9b:1::a00:1",
            "64:ff9b:1:ffff::1",
            "2001::1",
            "2001:0:4136:e378::1",
            "2001:2::1",
            "2001:2:0:ffff::1",
            "2001:10::1",
            "2001:1f::1",
            "2001:20::1",
            "2001:2f:ffff::1",
        ] {
            assert!(
                !is_public(private.parse().unwrap()),
                "{private} counted as public"
            );
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "2002:808:808::1",
            "2001:4860:4860::8888",
            "2001:2:1::1",
            "2001:30::1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public} refused");
        }
    }

    #[test]
    fn urls_are_https_without_credentials_and_not_at_a_private_literal_or_localhost() {
        assert!(check_url("https://hooks.example.com/keel?x=1", STRICT).is_ok());
        assert_eq!(
            check_url("http://hooks.example.com/", STRICT),
            Err(Refused::NotHttps)
        );
        assert_eq!(
            check_url("ftp://hooks.example.com/", STRICT),
            Err(Refused::Scheme)
        );
        assert_eq!(
            check_url("https://user:pw@hooks.example.com/", STRICT),
            Err(Refused::Credentials)
        );
        assert!(matches!(check_url("not a url", STRICT), Err(Refused::Invalid(_))));
        for private in [
            "https://127.0.0.1/",
            "https://[::1]:8443/",
            "https://[::ffff:10.0.0.1]/",
            "https://localhost/",
            "https://api.LOCALHOST./",
            "https://169.254.169.254/latest/meta-data",
            "https://2130706433/",
        ] {
            assert!(
                matches!(check_url(private, STRICT), Err(Refused::NotPublic(_))),
                "{private}"
            );
        }
        let open = Rules {
            allow_http: true,
            allow_private_destinations: true,
        };
        assert!(check_url("http://127.0.0.1:9000/hook", open).is_ok());
        assert_eq!(
            check_url(
                "http://127.0.0.1:9000/hook",
                Rules {
                    allow_http: true,
                    ..STRICT
                }
            ),
            Err(Refused::NotPublic("127.0.0.1".into()))
        );
    }

    /// The strings a pattern matches whole (the generator takes no anchors).
    fn unanchored(pattern: &str) -> proptest::string::RegexGeneratorStrategy<String> {
        let inner = pattern
            .strip_prefix('^')
            .and_then(|p| p.strip_suffix('$'))
            .unwrap();
        proptest::string::string_regex(inner).unwrap()
    }

    proptest::proptest! {
        /// Whatever the documents' pattern admits, keel saves (the contract's fuzzer sends
        /// such URLs and expects them taken).
        #[test]
        fn every_url_the_pattern_admits_is_taken(raw in unanchored(url_pattern(true))) {
            let open = Rules { allow_http: true, allow_private_destinations: true };
            proptest::prop_assert!(check_url(&raw, open).is_ok(), "{raw}: {:?}", check_url(&raw, open));
        }
    }

    #[test]
    fn the_pattern_leaves_out_what_keel_refuses_to_parse() {
        let pattern = regex::Regex::new(url_pattern(false)).unwrap();
        for taken in [
            "https://hooks.example.com/keel?x=1",
            "https://a.b.:65535#f",
            "https://collector:4318",
            "https://10.0.0.7:8443/hook",
            "https://[2001:db8::1]/",
            "https://[::1]",
        ] {
            assert!(pattern.is_match(taken), "{taken}");
            assert!(
                check_url(
                    taken,
                    Rules {
                        allow_private_destinations: true,
                        ..STRICT
                    }
                )
                .is_ok(),
                "{taken}"
            );
        }
        // What the fuzzer once sent and keel refused; a port past 65535; a numeric last
        // label (an IPv4 address to the URL parser); punycode that may not decode.
        for left_out in [
            "https://g*^.c%",
            "https://a:65536",
            "https://1.2.3.4.5",
            "https://01.2.3.4",
            "https://[:::1]",
            "https://xn--a.com",
            "https://user:pw@a.com",
            "http://a.com",
        ] {
            assert!(!pattern.is_match(left_out), "{left_out}");
        }
    }

    #[test]
    fn every_resolved_address_must_be_public() {
        let public: IpAddr = "93.184.216.34".parse().unwrap();
        let private: IpAddr = "10.0.0.7".parse().unwrap();
        assert!(check_addresses(&[public], STRICT).is_ok());
        assert_eq!(
            check_addresses(&[public, private], STRICT),
            Err(Refused::NotPublic("10.0.0.7".into()))
        );
        let open = Rules {
            allow_http: false,
            allow_private_destinations: true,
        };
        assert!(check_addresses(&[private], open).is_ok());
    }
}
