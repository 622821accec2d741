package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/changegate/changegate/sinks/kafka"
)

// SinkKafka produces events to Apache Kafka topics; see [KafkaSink].
const SinkKafka = "kafka"

// Defaults and limits of the kafka sink.
const (
	// DefaultKafkaMaxRequestBytes is the default record batch limit
	// (franz-go's default ProducerBatchMaxBytes, Kafka's historical
	// max.message.bytes); a topic's lower max.message.bytes wins.
	DefaultKafkaMaxRequestBytes = kafka.DefaultMaxRequestBytes
	// MaxKafkaMaxRequestBytes is the largest record batch limit franz-go
	// accepts (1 GiB).
	MaxKafkaMaxRequestBytes = kafka.MaxRequestBytesLimit
	// DefaultKafkaTimeout bounds one Send of a kafka sink.
	DefaultKafkaTimeout = 10 * time.Second
	// DefaultKafkaBatchSize is batch_size of a kafka sink when unset.
	DefaultKafkaBatchSize = 100
)

// kafkaSASLMechanisms are the sasl_mechanism values, as Kafka names them.
var kafkaSASLMechanisms = []string{kafka.SASLPlain, kafka.SASLScramSHA256, kafka.SASLScramSHA512}

// KafkaSink holds the options of a kafka sink.
type KafkaSink struct {
	// Brokers are the seed brokers, "host:port" (at least one).
	Brokers []string
	// Topic is the topic template: literal text and {db}, {coll},
	// {source}.
	Topic string
	// MaxRequestBytes is the record batch limit (default 1,000,012; the
	// topic's max.message.bytes when lower).
	MaxRequestBytes int
	// Timeout bounds one delivery request (default 10s).
	Timeout time.Duration
	// TLS enables TLS; TLSCAFile (absolute path), TLSCertFile and
	// TLSKeyFile (a client certificate) and TLSInsecureSkipVerify need it.
	TLS                     bool
	TLSCAFile               string
	TLSCertFile, TLSKeyFile string
	TLSInsecureSkipVerify   bool
	// SASLMechanism is "" (none), "PLAIN", "SCRAM-SHA-256" or
	// "SCRAM-SHA-512"; SASLUsername and SASLPassword are then required.
	SASLMechanism string
	SASLUsername  Secret
	SASLPassword  Secret
}

func decodeKafka(d *decoder, o *obj, s *Sink) {
	k := &KafkaSink{}
	s.Kafka = k
	if bs, elems, v := o.strings("brokers"); v == nil {
		o.missing("brokers")
	} else if !o.bad["brokers"] {
		if len(bs) == 0 {
			d.errorf(o.keyPath("brokers"), v.line, `must list at least one broker, like ["kafka-1:9092"]`)
		}
		for i, b := range bs {
			if msg := kafka.CheckBroker(b); msg != "" {
				d.errorf(indexPath(o.keyPath("brokers"), i), elems[i].line, "%s", msg)
			}
		}
		k.Brokers = bs
	}
	if t, ok := o.reqString("topic"); ok {
		if _, err := kafka.CompileTopic(t); err != nil {
			d.errorf(o.keyPath("topic"), o.lineOf("topic"), "%v", err)
		}
		k.Topic = t
	}
	k.MaxRequestBytes = int(o.integer("max_request_bytes", DefaultKafkaMaxRequestBytes, minMaxRequestBytes, MaxKafkaMaxRequestBytes))
	k.Timeout, _ = o.duration("timeout", DefaultKafkaTimeout, time.Millisecond)

	k.TLS = o.boolean("tls", false)
	for _, key := range []string{"tls_ca_file", "tls_cert_file", "tls_key_file", "tls_insecure_skip_verify"} {
		if v := o.t.get(key); v != nil && !k.TLS && !o.bad["tls"] {
			d.errorf(o.keyPath(key), v.line, "applies only with tls = true")
		}
	}
	if f, v, ok := o.str("tls_ca_file"); v != nil && ok {
		k.TLSCAFile = d.resolvePath(f)
		if pem, err := os.ReadFile(k.TLSCAFile); err != nil {
			d.errorf(o.keyPath("tls_ca_file"), v.line, "cannot read CA file: %v", err)
		} else if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			d.errorf(o.keyPath("tls_ca_file"), v.line, "no PEM certificate found in %s", k.TLSCAFile)
		}
	}
	cert, cv, cok := o.str("tls_cert_file")
	key, kv, kok := o.str("tls_key_file")
	switch {
	case cv != nil && kv == nil:
		d.errorf(o.keyPath("tls_key_file"), cv.line, "required with tls_cert_file")
	case kv != nil && cv == nil:
		d.errorf(o.keyPath("tls_cert_file"), kv.line, "required with tls_key_file")
	case cok && kok:
		k.TLSCertFile, k.TLSKeyFile = d.resolvePath(cert), d.resolvePath(key)
		if _, err := tls.LoadX509KeyPair(k.TLSCertFile, k.TLSKeyFile); err != nil {
			d.errorf(o.keyPath("tls_cert_file"), cv.line, "cannot load the client certificate: %v", err)
		}
	}
	k.TLSInsecureSkipVerify = o.boolean("tls_insecure_skip_verify", false)

	k.SASLMechanism = o.enum("sasl_mechanism", "", kafkaSASLMechanisms)
	mv := o.t.get("sasl_mechanism")
	var uv, pv *value
	k.SASLUsername, uv = o.secret("sasl_username")
	k.SASLPassword, pv = o.secret("sasl_password")
	if mv == nil {
		for _, kv := range []struct {
			key string
			v   *value
		}{{"sasl_username", uv}, {"sasl_password", pv}} {
			if kv.v != nil {
				d.errorf(o.keyPath(kv.key), kv.v.line, "applies only with sasl_mechanism")
			}
		}
	} else if !o.bad["sasl_mechanism"] {
		for _, kv := range []struct {
			key string
			v   *value
			s   Secret
		}{{"sasl_username", uv, k.SASLUsername}, {"sasl_password", pv, k.SASLPassword}} {
			switch {
			case kv.v == nil:
				d.errorf(o.keyPath(kv.key), mv.line, "required with sasl_mechanism = %q", k.SASLMechanism)
			case kv.s.Value() == "" && !o.bad[kv.key]:
				d.errorf(o.keyPath(kv.key), kv.v.line, "must not be empty")
			}
		}
	}

	// Credentials in clear text and unverified certificates.
	c := d.cleartext(o)
	switch {
	case k.SASLMechanism == "" || k.TLS || o.bad["tls"]:
	case k.SASLMechanism == "PLAIN":
		c.refuse("sasl_mechanism", `"PLAIN" sends the password in clear text without tls = true; set tls = true`)
	default:
		c.refuse("sasl_mechanism", fmt.Sprintf("%q without tls = true sends the user name and the exchange unencrypted (an eavesdropper can guess the password offline), and every record; set tls = true", k.SASLMechanism))
	}
	if k.TLSInsecureSkipVerify {
		c.refuse("tls_insecure_skip_verify", insecureSkipVerify)
	}
}
