package subscription

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/sinks/webhook"
)

// Status is a subscription's state.
type Status string

const (
	// StatusActive subscriptions receive their events.
	StatusActive Status = "active"
	// StatusPaused subscriptions keep their events (parked) until resumed.
	StatusPaused Status = "paused"
	// StatusDisabled subscriptions were paused by changegate (an endpoint
	// failing for disable_after, a definition the configuration no longer
	// accepts), with the reason in Subscription.Reason.
	StatusDisabled Status = "disabled"
)

// Problem is one thing wrong with a subscription's JSON form, with its
// JSONPath.
type Problem = config.Problem

// Subscription is one stored subscription.
type Subscription struct {
	// Name identifies the subscription; its rule and its sink are named
	// after it. It never changes.
	Name string
	// Spec is the subscription's JSON form as accepted (compact): what
	// config.ParseSubscriptionJSON decodes into a rule and a sink.
	Spec json.RawMessage
	// Status is StatusActive, StatusPaused or StatusDisabled.
	Status Status
	// Reason says why a subscription is paused or disabled ("" when
	// active or not given).
	Reason string
	// CreatedClusterTime is the cluster time read just before the
	// subscription was stored: it receives the changes committed after it.
	CreatedClusterTime bson.Timestamp
	// CreatedAt and UpdatedAt are the times of its creation and of its
	// last change (the writing replica's clock).
	CreatedAt, UpdatedAt time.Time
	// Revision is 1 on creation and grows by one with every change: the
	// precondition of a conditional change (optimistic concurrency).
	Revision int64
	// Secrets are the signing secrets, sealed; the current one first.
	Secrets []SealedSecret
}

// MarshalJSON renders the subscription as the API shows it: the members of
// its JSON form (header values replaced by "[redacted]": they may hold
// credentials) and "status", "reason", "created_at", "created_cluster_time",
// "updated_at", "revision" and "signing_secrets" (when each secret was
// created and, for rotated-out ones, until when it signs; never the
// secrets).
func (s Subscription) MarshalJSON() ([]byte, error) {
	out := map[string]any{}
	dec := json.NewDecoder(bytes.NewReader(s.Spec))
	dec.UseNumber() // numbers of the filter as written
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("subscription %s: stored form: %w", s.Name, err)
	}
	if sink, ok := out["sink"].(map[string]any); ok {
		if h, ok := sink["headers"].(map[string]any); ok {
			for k := range h {
				h[k] = "[redacted]"
			}
		}
	}
	type shownSecret struct {
		CreatedAt time.Time  `json:"created_at"`
		ExpiresAt *time.Time `json:"expires_at,omitempty"`
	}
	secrets := make([]shownSecret, 0, len(s.Secrets))
	for _, ss := range s.Secrets {
		sh := shownSecret{CreatedAt: ss.CreatedAt}
		if !ss.ExpiresAt.IsZero() {
			exp := ss.ExpiresAt
			sh.ExpiresAt = &exp
		}
		secrets = append(secrets, sh)
	}
	out["status"] = s.Status
	if s.Reason != "" {
		out["reason"] = s.Reason
	}
	out["created_at"] = s.CreatedAt
	out["created_cluster_time"] = map[string]uint32{"t": s.CreatedClusterTime.T, "i": s.CreatedClusterTime.I}
	out["updated_at"] = s.UpdatedAt
	out["revision"] = s.Revision
	out["signing_secrets"] = secrets
	return json.Marshal(out)
}

// Validator checks subscriptions' JSON forms against the running
// configuration, with the code that checks the configuration file.
type Validator struct {
	// Config is the running configuration: its sources, its
	// [subscriptions] table, and the sink and rule names it reserves.
	Config *config.Config
	// Taken, when set, reports a name the configuration file already
	// uses, in place of the names of Config's sinks and rules.
	Taken func(name string) bool
	// Resolve, when set, looks a URL's host name up so that a name
	// resolving to a private address is refused too (net.DefaultResolver's
	// LookupNetIP). Without it only IP literals and localhost names are
	// refused here; the webhook's dialer refuses every private address it
	// would connect to in any case.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
}

// Validate decodes body, the JSON form of a subscription, and checks it:
// config.ParseSubscriptionJSON (strict, bounded; the rules' and sinks'
// decoder, filter compiler and backtracking check), its name against the
// configuration's sink and rule names, and its URL against the
// private-network guard unless [subscriptions] allow_private_networks. It
// returns the decoded route and the body in compact form, or every problem
// found.
func (v *Validator) Validate(ctx context.Context, body []byte) (*config.SubscriptionRoute, json.RawMessage, []Problem) {
	route, problems := config.ParseSubscriptionJSON(body, v.Config)
	if route == nil {
		return nil, nil, problems
	}
	if v.taken(route.Rule.Name) {
		problems = append(problems, Problem{Path: "$.name", Message: fmt.Sprintf("%q is the name of a sink or rule of the configuration file: choose another", route.Rule.Name)})
	}
	if !v.Config.Subscriptions.AllowPrivateNetworks && route.Sink.Webhook != nil {
		if msg := v.checkTarget(ctx, route.Sink.Webhook.URL); msg != "" {
			problems = append(problems, Problem{Path: "$.sink.url", Message: msg})
		}
	}
	if len(problems) > 0 {
		return nil, nil, problems
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, body); err != nil { // parsed above: not expected
		return nil, nil, []Problem{{Path: "$", Message: err.Error()}}
	}
	return route, compact.Bytes(), nil
}

func (v *Validator) taken(name string) bool {
	if v.Taken != nil {
		return v.Taken(name)
	}
	return TakenByConfig(v.Config)(name)
}

// TakenByConfig returns a Validator.Taken that reports the names of cfg's
// sinks and rules: a subscription's sink and rule are named after it, and
// the names of the configuration file and of subscriptions share one
// namespace.
func TakenByConfig(cfg *config.Config) func(string) bool {
	names := map[string]bool{}
	for _, s := range cfg.Sinks {
		names[s.Name] = true
	}
	for _, r := range cfg.Rules {
		names[r.Name] = true
	}
	return func(name string) bool { return names[name] }
}

// checkTarget returns why the URL's host may not be targeted, or "". It
// names the host, never the URL (its path may hold a token).
func (v *Validator) checkTarget(ctx context.Context, rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "" // reported by the decoder
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	refuse := func(what, kind string) string {
		return fmt.Sprintf("refused: %s is a %s address; private, loopback and link-local targets need [subscriptions] allow_private_networks in the operator's configuration", what, kind)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if kind := webhook.ForbiddenAddr(ip); kind != "" {
			return refuse(host, kind)
		}
		return ""
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return refuse(host, "loopback")
	}
	if v.Resolve == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	addrs, err := v.Resolve(ctx, host)
	if err != nil {
		return "" // not resolvable now; the dialer checks what it connects to
	}
	for _, a := range addrs {
		if kind := webhook.ForbiddenAddr(a); kind != "" {
			return refuse(fmt.Sprintf("%s (%s)", host, a), kind)
		}
	}
	return ""
}

// DefaultResolve is a Validator.Resolve with the system's resolver.
func DefaultResolve(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}
