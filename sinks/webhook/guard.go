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
	cgnat       = netip.MustParsePrefix("100.64.0.0/10")  // RFC 6598 shared address space
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")      // RFC 1122 "this network"
	nat64       = netip.MustParsePrefix("64:ff9b::/96")   // RFC 6052 well-known NAT64 prefix
	nat64Local  = netip.MustParsePrefix("64:ff9b:1::/48") // RFC 8215 local-use NAT64 prefix
	broadcast   = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	metadata    = []netip.Addr{
		netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, ...
		netip.MustParseAddr("fd00:ec2::254"),   // AWS IMDS over IPv6
		netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	}
)

// classifyAddr returns why ip is not an acceptable webhook target ("" when
// it is a public unicast address). IPv4-mapped IPv6 addresses and the IPv4
// address embedded in a NAT64 address are checked as IPv4.
func classifyAddr(ip netip.Addr) string {
	ip = ip.Unmap().WithZone("")
	if ip.Is6() && (nat64.Contains(ip) || nat64Local.Contains(ip)) {
		b := ip.As16()
		if k := classifyAddr(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})); k != "" {
			return k + " (via NAT64)"
		}
	}
	for _, m := range metadata {
		if ip == m {
			return "cloud metadata"
		}
	}
	switch {
	case !ip.IsValid():
		return "invalid"
	case ip.IsUnspecified() || thisNetwork.Contains(ip):
		return "unspecified"
	case ip.IsLoopback():
		return "loopback"
	case ip.IsPrivate():
		return "private"
	case ip.IsLinkLocalUnicast():
		return "link-local"
	case ip.IsMulticast():
		return "multicast"
	case ip == broadcast:
		return "broadcast"
	case cgnat.Contains(ip):
		return "shared (CGNAT)"
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
