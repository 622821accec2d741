package config

import (
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"time"
)

// Defaults and bounds of the [subscriptions] table and of [[server.tokens]].
const (
	// DefaultMaxSubscriptions is subscriptions.max_subscriptions when
	// unset; MaxMaxSubscriptions is the largest accepted.
	DefaultMaxSubscriptions = 1000
	MaxMaxSubscriptions     = 100000
	// DefaultDeleteGrace is subscriptions.delete_grace when unset.
	DefaultDeleteGrace = 24 * time.Hour
	// SubscriptionKeyBytes is the length of the key that encrypts the
	// subscriptions' signing secrets (AES-256-GCM).
	SubscriptionKeyBytes = 32
	// SubscriptionKeyEnv is the environment variable that may hold that
	// key, base64, instead of subscriptions.key_file.
	SubscriptionKeyEnv = "CHANGEGATE_SECRET_KEY"
	// MinTokenLength is the shortest [[server.tokens]] token accepted.
	MinTokenLength = MinAdminTokenLength
)

// Subscriptions is the [subscriptions] table: what the subscriptions API
// (subscriptions the teams receiving events create at runtime, stored in
// MongoDB) may do. Only the operator decides this; no request can change it.
type Subscriptions struct {
	// Enabled turns the subscriptions API and the applying of stored
	// subscriptions on (default false).
	Enabled bool
	// Key is the 32-byte key that encrypts the signing secrets at rest,
	// from KeyFile or the CHANGEGATE_SECRET_KEY environment variable
	// (base64 in either); empty when neither is set, and then creating a
	// subscription is refused.
	Key Secret
	// KeySource says where Key came from, for messages: "key_file <path>",
	// "CHANGEGATE_SECRET_KEY" or "".
	KeySource string
	// KeyFile is the key_file path as resolved (empty: not set).
	KeyFile string
	// MaxSubscriptions caps the stored subscriptions (default 1000).
	MaxSubscriptions int
	// AllowPrivateNetworks lets subscriptions target loopback, private,
	// link-local and metadata addresses (default false).
	AllowPrivateNetworks bool
	// EventsSink names a [[sinks]] entry that receives the subscriptions'
	// operational notices (subscription.disabled, subscription.recovered,
	// delivery.exhausted: subscription.Notifier); empty: none.
	EventsSink string
	// DeleteGrace is how long what a deleted subscription parked or
	// dead-lettered is kept (to replay or export it) before it is
	// removed (default 24h; 0: at once).
	DeleteGrace time.Duration
}

// Token is one [[server.tokens]] entry: a bearer token that may manage only
// the subscriptions whose names start with Prefix, and read only their
// deliveries and dead letters.
type Token struct {
	// Name identifies the token in the audit log and the process log
	// (never the token itself); unique, matching [A-Za-z0-9_.-]+.
	Name string
	// Token is the bearer token (secret-capable, at least MinTokenLength
	// characters, different from every other token and from admin_token).
	Token Secret
	// Prefix is the subscription name prefix the token is scoped to
	// (required, non-empty, of the characters of a name).
	Prefix string
}

// tokens decodes the [[server.tokens]] entries of the [server] table o.
func (d *decoder) tokens(o *obj, admin Secret) []Token {
	var out []Token
	names := map[string]int{}
	values := map[string]int{}
	for _, t := range o.tables("tokens") {
		var tok Token
		var nameVal *value
		tok.Name, nameVal = t.name()
		if nameVal != nil {
			if first, dup := names[tok.Name]; dup {
				d.errorf(t.keyPath("name"), nameVal.line, "duplicate token name %q (first defined at line %d)", tok.Name, first)
			} else {
				names[tok.Name] = nameVal.line
			}
		}
		sec, v := t.secret("token")
		switch {
		case v == nil:
			t.missing("token")
		case t.bad["token"]:
		case strings.TrimSpace(sec.Value()) == "":
			d.errorf(t.keyPath("token"), v.line, "must not be empty or white space")
		case len([]rune(sec.Value())) < MinTokenLength:
			d.errorf(t.keyPath("token"), v.line, "is %d characters, want at least %d (e.g. the output of openssl rand -hex 16)", len([]rune(sec.Value())), MinTokenLength)
		case sec == admin:
			d.errorf(t.keyPath("token"), v.line, "is the same as server.admin_token: a scoped token must differ from it")
		default:
			if first, dup := values[sec.Value()]; dup {
				// Never echo the token: name the line of its twin.
				d.errorf(t.keyPath("token"), v.line, "is the same token as the one at line %d: each token must be different", first)
			} else {
				values[sec.Value()] = v.line
				tok.Token = sec
			}
		}
		if p, pv := t.reqString("prefix"); pv {
			if !nameRE.MatchString(p) {
				d.errorf(t.keyPath("prefix"), t.lineOf("prefix"), `invalid prefix %q: use only letters, digits, "_", "." and "-" (at least one), as in subscription names`, p)
			} else {
				tok.Prefix = p
			}
		}
		t.done()
		out = append(out, tok)
	}
	return out
}

// subscriptions decodes the [subscriptions] table; cfg holds the sinks
// (events_sink must name one).
func (d *decoder) subscriptions(o *obj, cfg *Config) Subscriptions {
	s := Subscriptions{
		Enabled:          o.boolean("enabled", false),
		MaxSubscriptions: int(o.integer("max_subscriptions", DefaultMaxSubscriptions, 1, MaxMaxSubscriptions)),
	}
	s.AllowPrivateNetworks = o.boolean("allow_private_networks", false)
	s.DeleteGrace, _ = o.duration("delete_grace", DefaultDeleteGrace, 0)
	env, envSet := d.lookupEnv(SubscriptionKeyEnv)
	envSet = envSet && strings.TrimSpace(env) != ""
	if f, v, ok := o.str("key_file"); v != nil && ok {
		switch {
		case f == "":
			d.errorf(o.keyPath("key_file"), v.line, "must not be empty (omit it to use %s)", SubscriptionKeyEnv)
		case envSet:
			d.errorf(o.keyPath("key_file"), v.line, "%s is set too: give the key one way only", SubscriptionKeyEnv)
		default:
			s.KeyFile = d.resolvePath(f)
			data, err := os.ReadFile(s.KeyFile)
			if err != nil {
				d.errorf(o.keyPath("key_file"), v.line, "cannot read key file: %v", err)
				break
			}
			if key, msg := decodeSubscriptionKey(string(data)); msg != "" {
				d.errorf(o.keyPath("key_file"), v.line, "%s: %s", s.KeyFile, msg)
			} else {
				s.Key, s.KeySource = key, "key_file "+s.KeyFile
			}
		}
	} else if envSet {
		if key, msg := decodeSubscriptionKey(env); msg != "" {
			d.errorf("subscriptions", o.line, "environment variable %s: %s", SubscriptionKeyEnv, msg)
		} else {
			s.Key, s.KeySource = key, SubscriptionKeyEnv
		}
	}
	if name, v, ok := o.str("events_sink"); v != nil && ok {
		if cfg.Sink(name) == nil {
			names := make([]string, 0, len(cfg.Sinks))
			for _, sk := range cfg.Sinks {
				names = append(names, sk.Name)
			}
			d.errorf(o.keyPath("events_sink"), v.line, "unknown sink %q%s", name, didYouMean(name, names))
		} else {
			s.EventsSink = name
		}
	}
	o.done()
	return s
}

// decodeSubscriptionKey decodes a base64 key of SubscriptionKeyBytes
// bytes (surrounding white space ignored); msg says what is wrong, without
// echoing the key.
func decodeSubscriptionKey(s string) (Secret, string) {
	s = strings.TrimSpace(s)
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		key, err = base64.RawStdEncoding.DecodeString(s)
	}
	if err != nil {
		return "", "the key is not standard base64 (make one with: openssl rand -base64 32)"
	}
	if len(key) != SubscriptionKeyBytes {
		return "", fmt.Sprintf("the key is %d bytes, want exactly %d (make one with: openssl rand -base64 32)", len(key), SubscriptionKeyBytes)
	}
	return Secret(key), ""
}
