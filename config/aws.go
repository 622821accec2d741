package config

import (
	"regexp"
	"strings"
	"time"
)

// Defaults and limits of the AWS sinks.
const (
	// DefaultAWSTimeout bounds one request of an AWS sink.
	DefaultAWSTimeout = 10 * time.Second
	// DefaultEventBridgeMaxRequestBytes is the default PutEvents request
	// limit (256 KiB, the documented limit and LocalStack's).
	DefaultEventBridgeMaxRequestBytes = 256 << 10
	// MaxEventBridgeMaxRequestBytes is the largest max_request_bytes of an
	// eventbridge sink: 1 MiB, PutEvents' current limit per the SDK docs.
	MaxEventBridgeMaxRequestBytes = 1 << 20
	// DefaultSQSMaxRequestBytes is the default SendMessageBatch payload
	// limit: 1 MiB, SQS's current maximum message size and a queue's
	// default MaximumMessageSize (see sqs.DefaultMaxRequestBytes for the
	// sources).
	DefaultSQSMaxRequestBytes = 1 << 20
	// MaxSQSMaxRequestBytes is the SendMessageBatch payload limit of the API
	// (1 MiB).
	MaxSQSMaxRequestBytes = 1 << 20
	// minMaxRequestBytes is the smallest max_request_bytes accepted.
	minMaxRequestBytes = 1024
	// DefaultEventBridgeSource and DefaultEventBridgeDetailType are the
	// entry templates used when none is configured.
	DefaultEventBridgeSource     = "changegate.{source}"
	DefaultEventBridgeDetailType = "{db}.{coll}.{operationType}"
)

var (
	regionRE    = regexp.MustCompile(`^[a-z]{2}(-[a-z0-9]+)+-[0-9]+$`)
	busNameRE   = regexp.MustCompile(`^[/.\-_A-Za-z0-9]{1,256}$`)
	queueNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,75}(\.fifo)?$`)
	roleARNRE   = regexp.MustCompile(`^arn:[a-z-]+:iam::[0-9]{12}:role/.+$`)
	// fieldPathRE is a dotted path of non-empty field names.
	fieldPathRE = regexp.MustCompile(`^[^.\s]+(\.[^.\s]+)*$`)
)

// templateFields are the placeholders of the EventBridge templates.
var templateFields = []string{"db", "coll", "operationType", "source"}

// checkTemplate returns why s is not a valid entry template, or "".
func checkTemplate(s string) string {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case (c == '{' || c == '}') && i+1 < len(s) && s[i+1] == c:
			i++
		case c == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return `unterminated "{" (write "{{" for a literal brace)`
			}
			name := s[i+1 : i+end]
			if !contains(templateFields, name) {
				return "unknown placeholder {" + name + "}" + didYouMean(name, templateFields) + "; allowed: {db}, {coll}, {operationType}, {source}"
			}
			i += end
		case c == '}':
			return `unbalanced "}" (write "}}" for a literal brace)`
		}
	}
	return ""
}

// aws decodes the options shared by the AWS sinks.
func (d *decoder) aws(o *obj, defMaxBytes, maxMaxBytes int64) AWS {
	var a AWS
	if r, v, ok := o.str("region"); ok {
		if !regionRE.MatchString(r) {
			d.errorf(o.keyPath("region"), v.line, `invalid region %q: use a region code like "us-east-1"`, r)
		}
		a.Region = r
	}
	if u, v, ok := o.str("endpoint"); ok {
		if msg := checkHTTPURL(u); msg != "" {
			d.errorf(o.keyPath("endpoint"), v.line, "%s", msg)
		}
		a.Endpoint = u
	}
	if r, v, ok := o.str("role_arn"); ok {
		if !roleARNRE.MatchString(r) {
			d.errorf(o.keyPath("role_arn"), v.line, `must be an IAM role ARN like "arn:aws:iam::123456789012:role/changegate", got %q`, r)
		}
		a.RoleARN = r
	}
	a.MaxRequestBytes = int(o.integer("max_request_bytes", defMaxBytes, minMaxRequestBytes, maxMaxBytes))
	a.Timeout, _ = o.duration("timeout", DefaultAWSTimeout, time.Millisecond)
	return a
}

func decodeEventBridge(d *decoder, o *obj, s *Sink) {
	e := &EventBridgeSink{}
	s.EventBridge = e
	if b, ok := o.reqString("event_bus"); ok {
		switch {
		case strings.HasPrefix(b, "arn:"):
			if !strings.Contains(b, ":event-bus/") {
				d.errorf(o.keyPath("event_bus"), o.lineOf("event_bus"), `an ARN must be an event bus ARN like "arn:aws:events:us-east-1:123456789012:event-bus/orders"`)
			}
		case !busNameRE.MatchString(b):
			d.errorf(o.keyPath("event_bus"), o.lineOf("event_bus"), `invalid event bus name %q: use 1 to 256 letters, digits, ".", "-", "_" and "/", or an ARN`, b)
		}
		e.EventBus = b
	}
	e.AWS = d.aws(o, DefaultEventBridgeMaxRequestBytes, MaxEventBridgeMaxRequestBytes)
	e.Source = DefaultEventBridgeSource
	if t, v, ok := o.str("source"); ok {
		switch {
		case t == "":
			d.errorf(o.keyPath("source"), v.line, "must not be empty")
		case strings.HasPrefix(t, "aws."):
			d.errorf(o.keyPath("source"), v.line, `must not start with "aws." (reserved for AWS services)`)
		default:
			if msg := checkTemplate(t); msg != "" {
				d.errorf(o.keyPath("source"), v.line, "%s", msg)
			}
		}
		e.Source = t
	}
	e.DetailType = DefaultEventBridgeDetailType
	if t, v, ok := o.str("detail_type"); ok {
		if t == "" {
			d.errorf(o.keyPath("detail_type"), v.line, "must not be empty")
		} else if msg := checkTemplate(t); msg != "" {
			d.errorf(o.keyPath("detail_type"), v.line, "%s", msg)
		}
		e.DetailType = t
	}
	if rs, elems, v := o.strings("resources"); v != nil && !o.bad["resources"] {
		for i, r := range rs {
			if !strings.HasPrefix(r, "arn:") {
				d.errorf(indexPath(o.keyPath("resources"), i), elems[i].line, "must be an ARN (arn:...), got %q", r)
			}
		}
		e.Resources = rs
	}
}

func decodeSQS(d *decoder, o *obj, s *Sink) {
	q := &SQSSink{}
	s.SQS = q
	u, uv, uok := o.str("queue_url")
	n, nv, nok := o.str("queue_name")
	switch {
	case uv != nil && nv != nil:
		d.errorf(o.keyPath("queue_name"), nv.line, "cannot be combined with queue_url (set one of them)")
	case uv == nil && nv == nil && !o.bad["queue_url"] && !o.bad["queue_name"]:
		if !o.noMissing {
			d.errorf(o.keyPath("queue_url"), o.line, "required key is missing (or set queue_name)")
		}
	}
	if uok {
		if msg := checkHTTPURL(u); msg != "" {
			d.errorf(o.keyPath("queue_url"), uv.line, "%s", msg)
		}
		q.QueueURL = u
	}
	if nok {
		if !queueNameRE.MatchString(n) {
			d.errorf(o.keyPath("queue_name"), nv.line, `invalid queue name %q: use 1 to 80 letters, digits, "-" and "_", ending in ".fifo" for a FIFO queue`, n)
		}
		q.QueueName = n
	}
	q.AWS = d.aws(o, DefaultSQSMaxRequestBytes, MaxSQSMaxRequestBytes)
	if g, v, ok := o.str("message_group_id"); ok {
		switch {
		case !fieldPathRE.MatchString(g):
			d.errorf(o.keyPath("message_group_id"), v.line, `must be a dotted field path like "fullDocument.customerId", got %q`, g)
		case (uok || nok) && !q.FIFO():
			d.errorf(o.keyPath("message_group_id"), v.line, `only applies to FIFO queues (a queue name ending in ".fifo")`)
		}
		q.MessageGroupID = g
	}
}
