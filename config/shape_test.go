package config

import (
	"reflect"
	"strings"
	"testing"
)

// defaultShape is the shaping of a rule or sink that sets none.
var defaultShape = Shape{RedactMode: RedactMask, Envelope: EnvelopeFull, IncludeUpdateDescription: true}

const shapeBase = `[mongo]
uri = "mongodb://localhost"

[[sources]]
name = "users"
`

func TestShapeKeys(t *testing.T) {
	env := func(k string) (string, bool) {
		return map[string]string{"REDACT_KEY": "0123456789abcdef0123"}[k], k == "REDACT_KEY"
	}
	cfg, err := Parse("config.toml", []byte(shapeBase+`
[[sinks]]
name = "partner"
type = "webhook"
url = "http://localhost:8080/"
fields = { "fullDocument.email" = 0, "fullDocument.card" = false, "fullDocument._id" = 1 }
redact = ["fullDocument.ssn", "fullDocument.**.password"]
redact_mode = "hash"
redact_key = "${REDACT_KEY}"
envelope = "document"
include_update_description = false
skip_empty_updates = true
max_updated_fields_bytes = 4096

[[rules]]
name = "r"
source = "users"
sinks = ["partner"]
fields = ["fullDocument.name", "fullDocument.address.city"]
envelope = "key"
`), env)
	if err != nil {
		t.Fatal(err)
	}
	want := Shape{
		Fields:     []ShapeField{{Path: "fullDocument.email"}, {Path: "fullDocument.card"}, {Path: "fullDocument._id", Include: true}},
		Redact:     []string{"fullDocument.ssn", "fullDocument.**.password"},
		RedactMode: RedactHash, RedactKey: "0123456789abcdef0123", Envelope: EnvelopeDocument,
		SkipEmptyUpdates: true, MaxUpdatedFieldsBytes: 4096,
	}
	if got := cfg.Sinks[0].Shape; !reflect.DeepEqual(got, want) {
		t.Errorf("sink shape\n got %#v\nwant %#v", got, want)
	}
	wantRule := defaultShape
	wantRule.Fields = []ShapeField{{Path: "fullDocument.name", Include: true}, {Path: "fullDocument.address.city", Include: true}}
	wantRule.Envelope = EnvelopeKey
	if got := cfg.Rules[0].Shape; !reflect.DeepEqual(got, wantRule) {
		t.Errorf("rule shape\n got %#v\nwant %#v", got, wantRule)
	}
	// The key never prints.
	if s := cfg.Sinks[0].Shape.RedactKey.String(); strings.Contains(s, "0123456789") {
		t.Errorf("redact_key prints as %q", s)
	}
}

func TestShapeErrors(t *testing.T) {
	cfg := shapeBase + `
[[sinks]]
name = "hook"
type = "webhook"
url = "http://localhost:8080/"
fields = { "fullDocument.a" = 1, "fullDocument.b" = 0 }
redact = ["fullDocument.a..b", "ssn", "fullDocument.x*"]
envelope = "body"

[[sinks]]
name = "hook2"
type = "webhook"
url = "http://localhost:8080/"
redact = ["fullDocument.a"]
redact_mode = "hash"
max_updated_fields_bytes = 0

[[sinks]]
name = "hook3"
type = "webhook"
url = "http://localhost:8080/"
redact_key = "0123456789abcdef"
fields = { "fullDocument.a" = 2 }

[[rules]]
name = "r"
source = "users"
sinks = ["hook", "hook2", "hook3"]
fields = { "fullDocument._id" = 0, "fullDocument.a" = 1, "fullDocument.b.c" = 1, "email" = 0 }
redact = ["fullDocument.**.", "fullDocument.$x"]
redact_mode = "hash"
redact_key = "short"
`
	_, err := Parse("config.toml", []byte(cfg), nil)
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{
		`sinks[0].fields."fullDocument.b": fields mixes inclusion and exclusion ("fullDocument.a" = 1, "fullDocument.b" = 0): use one or the other (only "fullDocument._id" = 0 may be added to an inclusion) at config.toml:11`,
		`sinks[0].redact[0]: path "fullDocument.a..b" has an empty field name at config.toml:12`,
		`sinks[0].redact[1]: path "ssn" must start with "fullDocument."`,
		`sinks[0].redact[2]: path "fullDocument.x*": a wildcard must be a whole field name, "**" (any number of fields) at config.toml:12`,
		`sinks[0].envelope: `,
		`"body"`,
		`at config.toml:13`,
		`sinks[1].redact_mode: "hash" needs redact_key (a secret: "${VAR}" or "file:/path") at config.toml:20`,
		`sinks[1].max_updated_fields_bytes: `,
		`at config.toml:21`,
		`sinks[2].redact_key: applies only with redact_mode = "hash" at config.toml:27`,
		`sinks[2].fields."fullDocument.a": must be 1 or true (include) or 0 or false (exclude), got integer at config.toml:28`,
		`rules[0].fields.email: path "email" must start with "fullDocument."`,
		`rules[0].redact[0]: path "fullDocument.**." has an empty field name at config.toml:35`,
		`rules[0].redact[1]: path "fullDocument.$x": field names starting with "$" cannot be used here at config.toml:35`,
		`rules[0].redact_key: the key is 5 bytes, want at least 16`,
		`at config.toml:37`,
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("missing %q in\n%s", w, msg)
		}
	}
	// _id = 0 with an inclusion, and b.c = 1 with a = 1, are fine.
	if strings.Contains(msg, `rules[0].fields."fullDocument._id"`) || strings.Contains(msg, `rules[0].fields."fullDocument.b.c"`) {
		t.Errorf("valid fields entries reported:\n%s", msg)
	}
}
