package awstest

import (
	"crypto/md5"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/big"
	"math/bits"
	"net/http"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// Kinesis limits, from the SDK's documentation of PutRecords
// (aws-sdk-go-v2/service/kinesis v1.56.13, api_op_PutRecords.go and
// api_op_UpdateMaxRecordSize.go).
const (
	// MaxPutRecordsRecords is the most records one PutRecords request may
	// carry.
	MaxPutRecordsRecords = 500
	// DefaultKinesisMaxRequestSize is the limit on one PutRecords request,
	// data and partition keys: 10 MiB. Override with
	// Options.MaxRequestSize.
	DefaultKinesisMaxRequestSize = 10 << 20
	// DefaultKinesisMaxRecordSize is a stream's default maximum record size
	// (data plus partition key): 1 MiB (MaxRecordSizeInKiB 1024).
	DefaultKinesisMaxRecordSize = 1 << 20
	// MaxPartitionKeyLength is the longest partition key, in Unicode
	// characters.
	MaxPartitionKeyLength = 256
)

// StreamOptions configure a stream created with CreateStreamWith.
type StreamOptions struct {
	// Shards is the number of shards (default 1); the hash key range is
	// split evenly between them, as CreateStream does.
	Shards int
	// MaxRecordSize limits data plus partition key of one record; default
	// DefaultKinesisMaxRecordSize.
	MaxRecordSize int
}

// Record is one record written (or offered, in a FailRecords callback) by
// the Kinesis server.
type Record struct {
	Stream          string // stream name
	ShardID         string // "shardId-000000000000"
	SequenceNumber  string // assigned on acceptance; empty in FailRecords callbacks
	PartitionKey    string
	ExplicitHashKey string
	Data            []byte
	// UserAgent is the User-Agent of the request that wrote it (the SDK
	// adds "app/<id>" with AWS_SDK_UA_APP_ID: tests tell processes apart).
	UserAgent string
}

type stream struct {
	name    string
	opts    StreamOptions
	records []Record
	seq     uint64
}

// Kinesis is a local Kinesis Data Streams endpoint serving
// Kinesis_20131202.PutRecords (AWS JSON 1.1) for streams created with
// CreateStream.
type Kinesis struct {
	*core
	maxRequest int

	mu      sync.Mutex
	streams map[string]*stream
	fail    func(Record) (code, message string)
}

// NewKinesis starts a Kinesis server on 127.0.0.1. Close it when done.
func NewKinesis(opts Options) *Kinesis {
	opts = opts.withDefaults()
	k := &Kinesis{maxRequest: opts.MaxRequestSize, streams: map[string]*stream{}}
	if k.maxRequest <= 0 {
		k.maxRequest = DefaultKinesisMaxRequestSize
	}
	k.core = newCore(opts, kinesisService{k})
	return k
}

// CreateStream creates a stream of one shard and returns its ARN.
func (k *Kinesis) CreateStream(name string) string { return k.CreateStreamWith(name, StreamOptions{}) }

// CreateStreamWith creates a stream with options and returns its ARN. An
// existing stream keeps its options.
func (k *Kinesis) CreateStreamWith(name string, o StreamOptions) string {
	if o.Shards <= 0 {
		o.Shards = 1
	}
	if o.MaxRecordSize <= 0 {
		o.MaxRecordSize = DefaultKinesisMaxRecordSize
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.streams[name]; !ok {
		k.streams[name] = &stream{name: name, opts: o}
	}
	return k.StreamARN(name)
}

// StreamARN is the ARN of stream name (whether or not it exists).
func (k *Kinesis) StreamARN(name string) string {
	return fmt.Sprintf("arn:aws:kinesis:%s:%s:stream/%s", k.opts.Region, k.opts.AccountID, name)
}

// Records returns a copy of the records stream name holds, in the order
// they were written (which, per shard, is sequence number order).
func (k *Kinesis) Records(name string) []Record {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := k.streams[name]
	if s == nil {
		return nil
	}
	out := make([]Record, len(s.records))
	for i, r := range s.records {
		r.Data = slices.Clone(r.Data)
		out[i] = r
	}
	return out
}

// FailRecords installs f, called for every record of a valid request; a
// non-empty code fails that record with ErrorCode code and ErrorMessage
// message (Kinesis documents "ProvisionedThroughputExceededException" and
// "InternalFailure"), counted in FailedRecordCount; the other records of
// the request are written. nil removes it. f may be called concurrently
// from several requests and must not call the server's methods.
func (k *Kinesis) FailRecords(f func(Record) (code, message string)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fail = f
}

// Reset clears the stored records, counters and every fault (Throttle,
// FailStatus, Stall, StallNext, FailRecords). Streams remain.
func (k *Kinesis) Reset() {
	k.mu.Lock()
	for _, s := range k.streams {
		s.records = nil
	}
	k.fail = nil
	k.mu.Unlock()
	k.resetCore()
}

type kinesisService struct{ k *Kinesis }

func (kinesisService) signingName() string  { return "kinesis" }
func (kinesisService) targetPrefix() string { return "Kinesis_20131202" }
func (kinesisService) contentType() string  { return "application/x-amz-json-1.1" }

func (kinesisService) authError(a *authError) apiError { return jsonAuthError(a) }

func (s kinesisService) throttleError() apiError {
	return apiError{status: http.StatusBadRequest, typ: "ProvisionedThroughputExceededException",
		message: "Rate exceeded for stream under account " + s.k.opts.AccountID + "."}
}

func (kinesisService) statusError(status int) apiError {
	switch status {
	case http.StatusServiceUnavailable:
		return apiError{status: status, typ: "ServiceUnavailable", message: "Service is unavailable."}
	default:
		return apiError{status: status, typ: "InternalFailure", message: fmt.Sprintf("Injected HTTP %d.", status)}
	}
}

func kinesisValidation(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "ValidationException", message: "1 validation error detected: " + fmt.Sprintf(format, args...)}
}

func (s kinesisService) handle(op string, body []byte, h http.Header) (any, *apiError) {
	if op != "PutRecords" {
		return nil, &apiError{status: http.StatusBadRequest, typ: "UnknownOperationException", message: "The test server does not implement Kinesis_20131202." + op}
	}
	var req struct {
		StreamName *string
		StreamARN  *string
		Records    []struct {
			Data            []byte
			PartitionKey    *string
			ExplicitHashKey *string
		}
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, &apiError{status: http.StatusBadRequest, typ: "SerializationException", message: err.Error()}
	}
	name := deref(req.StreamName)
	if arn := deref(req.StreamARN); arn != "" {
		n, ok := strings.CutPrefix(arn, strings.TrimSuffix(s.k.StreamARN("x"), "x"))
		if !ok || (name != "" && n != name) {
			return nil, &apiError{status: http.StatusBadRequest, typ: "InvalidArgumentException", message: "StreamARN " + arn + " does not name a stream of this account and region, or contradicts StreamName."}
		}
		name = n
	}
	if name == "" {
		return nil, &apiError{status: http.StatusBadRequest, typ: "InvalidArgumentException", message: "Either StreamName or StreamARN should be provided."}
	}
	n := len(req.Records)
	switch {
	case n == 0:
		return nil, kinesisValidation("Value '[]' at 'records' failed to satisfy constraint: Member must have length greater than or equal to 1")
	case n > MaxPutRecordsRecords:
		return nil, kinesisValidation("Value at 'records' failed to satisfy constraint: Member must have length less than or equal to %d", MaxPutRecordsRecords)
	}
	s.k.mu.Lock()
	st := s.k.streams[name]
	var opts StreamOptions
	if st != nil {
		opts = st.opts
	}
	fail := s.k.fail
	s.k.mu.Unlock()
	if st == nil {
		return nil, &apiError{status: http.StatusBadRequest, typ: "ResourceNotFoundException",
			message: fmt.Sprintf("Stream %s under account %s not found.", name, s.k.opts.AccountID)}
	}
	recs := make([]Record, n)
	total := 0
	for i, r := range req.Records {
		pk := deref(r.PartitionKey)
		if l := utf8.RuneCountInString(pk); l < 1 || l > MaxPartitionKeyLength {
			return nil, kinesisValidation("Value '%s' at 'records.%d.member.partitionKey' failed to satisfy constraint: Member must have length between 1 and %d", pk, i+1, MaxPartitionKeyLength)
		}
		if size := len(r.Data) + len(pk); size > opts.MaxRecordSize {
			return nil, kinesisValidation("Value at 'records.%d.member.data' failed to satisfy constraint: Member must have length less than or equal to %d", i+1, opts.MaxRecordSize-len(pk))
		}
		total += len(r.Data) + len(pk)
		recs[i] = Record{Stream: name, PartitionKey: pk, ExplicitHashKey: deref(r.ExplicitHashKey), Data: r.Data, UserAgent: h.Get("User-Agent")}
		shard, ok := shardOf(recs[i], opts.Shards)
		if !ok {
			return nil, &apiError{status: http.StatusBadRequest, typ: "InvalidArgumentException", message: "Invalid ExplicitHashKey " + recs[i].ExplicitHashKey + "."}
		}
		recs[i].ShardID = fmt.Sprintf("shardId-%012d", shard)
	}
	if total > s.k.maxRequest {
		return nil, &apiError{status: http.StatusBadRequest, typ: "InvalidArgumentException",
			message: fmt.Sprintf("Records size exceeds %d MB limit", s.k.maxRequest>>20)}
	}

	type result struct {
		SequenceNumber string `json:",omitempty"`
		ShardId        string `json:",omitempty"`
		ErrorCode      string `json:",omitempty"`
		ErrorMessage   string `json:",omitempty"`
	}
	resp := struct {
		FailedRecordCount int
		Records           []result
		EncryptionType    string
	}{Records: make([]result, n), EncryptionType: "NONE"}
	for i, r := range recs {
		if fail != nil {
			if code, msg := fail(r); code != "" {
				resp.FailedRecordCount++
				resp.Records[i] = result{ErrorCode: code, ErrorMessage: msg}
				continue
			}
		}
		s.k.mu.Lock()
		st.seq++
		r.SequenceNumber = fmt.Sprintf("4963%052d", st.seq)
		st.records = append(st.records, r)
		s.k.mu.Unlock()
		resp.Records[i] = result{SequenceNumber: r.SequenceNumber, ShardId: r.ShardID}
	}
	return resp, nil
}

// shardOf maps a record to its shard as Kinesis does: the MD5 of the
// partition key (or the ExplicitHashKey, a decimal 128-bit number) is a
// hash key, and the shards split the hash key range evenly.
func shardOf(r Record, shards int) (int, bool) {
	var hi uint64
	if r.ExplicitHashKey != "" {
		v, ok := new(big.Int).SetString(r.ExplicitHashKey, 10)
		if !ok || v.Sign() < 0 || v.BitLen() > 128 {
			return 0, false
		}
		hi = new(big.Int).Rsh(v, 64).Uint64()
	} else {
		sum := md5.Sum([]byte(r.PartitionKey))
		hi = binary.BigEndian.Uint64(sum[:8])
	}
	idx, _ := bits.Mul64(hi, uint64(shards))
	return int(idx), true
}
