package webhook

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// ErrForbiddenTarget is wrapped by the error of a delivery whose target
// address is refused by the private-network guard.
var ErrForbiddenTarget = errors.New("forbidden target")

// forbiddenTargetError is returned by the dialer's Control hook when the
// address being connected to is not a public unicast address.
type forbiddenTargetError struct {
	addr string // "ip:port" actually being dialled
	kind string // "loopback", "private", ...
}

func (e *forbiddenTargetError) Error() string {
	return fmt.Sprintf("refusing to connect to %s, a %s address (set allow_private_networks = true on the sink to allow private targets)", e.addr, e.kind)
}

func (e *forbiddenTargetError) Is(target error) bool { return target == ErrForbiddenTarget }

var (
	metadata = []netip.Addr{
		netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, ...
		netip.MustParseAddr("fd00:ec2::254"),   // AWS IMDS over IPv6
		netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	}
	nat64     = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052 well-known NAT64 prefix
	sixToFour = netip.MustParsePrefix("2002::/16")    // RFC 3056 6to4
)

// specialRange is a range of the IANA IPv4 and IPv6 Special-Purpose Address
// Registries (plus multicast and IPv4 class E) that a webhook may not
// target without allow_private_networks.
type specialRange struct {
	prefix netip.Prefix
	kind   string
}

// specialRanges lists the ranges refused outright, most specific first
// where they nest. The IPv4-mapped range (::ffff:0:0/96) is not here: a
// mapped address is judged as the IPv4 address it is. The well-known NAT64
// prefix and 6to4 are judged by the IPv4 address they embed (classifyAddr).
// Ranges the registries mark as globally reachable but that serve a
// protocol, not a web server (anycast relays, AS112, AMT, ORCHID, Teredo),
// are refused too: no webhook lives there.
var specialRanges = func() []specialRange {
	rs := []struct{ cidr, kind string }{
		// IPv4 (RFC 6890 and successors).
		{"0.0.0.0/8", "unspecified"},                          // RFC 791 "this network"
		{"10.0.0.0/8", "private"},                             // RFC 1918
		{"100.64.0.0/10", "shared (CGNAT)"},                   // RFC 6598
		{"127.0.0.0/8", "loopback"},                           // RFC 1122
		{"169.254.0.0/16", "link-local"},                      // RFC 3927
		{"172.16.0.0/12", "private"},                          // RFC 1918
		{"192.0.0.0/24", "IETF protocol assignment"},          // RFC 6890 (DS-Lite, PCP and TURN anycast, NAT64 discovery, ...)
		{"192.0.2.0/24", "documentation"},                     // RFC 5737 TEST-NET-1
		{"192.31.196.0/24", "AS112"},                          // RFC 7535
		{"192.52.193.0/24", "AMT"},                            // RFC 7450
		{"192.88.99.0/24", "6to4 relay anycast (deprecated)"}, // RFC 7526
		{"192.168.0.0/16", "private"},                         // RFC 1918
		{"192.175.48.0/24", "AS112"},                          // RFC 7534
		{"198.18.0.0/15", "benchmarking"},                     // RFC 2544
		{"198.51.100.0/24", "documentation"},                  // RFC 5737 TEST-NET-2
		{"203.0.113.0/24", "documentation"},                   // RFC 5737 TEST-NET-3
		{"224.0.0.0/4", "multicast"},                          // RFC 5771
		{"255.255.255.255/32", "broadcast"},                   // RFC 919
		{"240.0.0.0/4", "reserved"},                           // RFC 1112 class E
		// IPv6 (RFC 6890 and successors).
		{"::/128", "unspecified"},                 // RFC 4291
		{"::1/128", "loopback"},                   // RFC 4291
		{"::/96", "IPv4-compatible (deprecated)"}, // RFC 4291 ::a.b.c.d
		{"::ffff:0:0:0/96", "IPv4-translated"},    // RFC 2765 SIIT
		{"64:ff9b:1::/48", "local-use NAT64"},     // RFC 8215
		{"100::/64", "discard-only"},              // RFC 6666
		{"100:0:0:1::/64", "dummy prefix"},        // RFC 9780
		{"2001::/32", "Teredo"},                   // RFC 4380 (embeds IPv4 addresses)
		{"2001:db8::/32", "documentation"},        // RFC 3849
		{"2001::/23", "IETF protocol assignment"}, // RFC 2928 (benchmarking, AMT, AS112, ORCHID, ...)
		{"2620:4f:8000::/48", "AS112"},            // RFC 7534
		{"3fff::/20", "documentation"},            // RFC 9637
		{"5f00::/16", "SRv6 SIDs"},                // RFC 9602
		{"fc00::/7", "private"},                   // RFC 4193 unique local
		{"fe80::/10", "link-local"},               // RFC 4291
		{"fec0::/10", "site-local (deprecated)"},  // RFC 3879
		{"ff00::/8", "multicast"},                 // RFC 4291
	}
	out := make([]specialRange, len(rs))
	for i, r := range rs {
		out[i] = specialRange{netip.MustParsePrefix(r.cidr), r.kind}
	}
	return out
}()

// classifyAddr returns why ip is not an acceptable webhook target ("" when
// it is a public unicast address): a cloud metadata address, or one of
// specialRanges. IPv4-mapped IPv6 addresses are checked as IPv4; the IPv4
// address embedded in a well-known NAT64 or a 6to4 address is checked too.
func classifyAddr(ip netip.Addr) string {
	ip = ip.Unmap().WithZone("")
	if !ip.IsValid() {
		return "invalid"
	}
	if ip.Is6() {
		b := ip.As16()
		var embedded netip.Addr
		via := ""
		switch {
		case nat64.Contains(ip):
			embedded, via = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), "NAT64"
		case sixToFour.Contains(ip):
			embedded, via = netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), "6to4"
		}
		if via != "" {
			if k := classifyAddr(embedded); k != "" {
				return k + " (via " + via + ")"
			}
		}
	}
	for _, m := range metadata {
		if ip == m {
			return "cloud metadata"
		}
	}
	for _, r := range specialRanges {
		if r.prefix.Contains(ip) {
			return r.kind
		}
	}
	return ""
}

// guardControl is a net.Dialer Control hook that refuses non-public
// targets. It sees the resolved IP actually being connected to (after DNS,
// once per address tried), so a name that resolves, or later re-resolves, to
// a private address cannot slip through.
func guardControl(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &forbiddenTargetError{addr: address, kind: "unparseable"}
	}
	if kind := classifyAddr(ap.Addr()); kind != "" {
		return &forbiddenTargetError{addr: address, kind: kind}
	}
	return nil
}

// ForbiddenAddr returns why ip may not be a webhook's target unless the
// operator allows private networks ("loopback", "private", "link-local",
// "cloud metadata", ...), or "" for a public unicast address. It is the
// check the dialer applies to every address it connects to, for callers
// that refuse a target before any connection (the subscriptions API).
func ForbiddenAddr(ip netip.Addr) string { return classifyAddr(ip) }
