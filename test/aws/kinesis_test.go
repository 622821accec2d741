package awstest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	kintypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/smithy-go"
)

func kinesisClient(k *Kinesis, optFns ...func(*kinesis.Options)) *kinesis.Client {
	return kinesis.NewFromConfig(clientConfig(k, 1), optFns...)
}

func rec(pk, data string) kintypes.PutRecordsRequestEntry {
	return kintypes.PutRecordsRequestEntry{PartitionKey: aws.String(pk), Data: []byte(data)}
}

// TestKinesisPutRecords runs the real SDK client against the server: the
// request it sends (AWS JSON 1.1, base64 data, SigV4) is accepted, the
// answer parsed, by name and by ARN, with per-record failures.
func TestKinesisPutRecords(t *testing.T) {
	k := NewKinesis(Options{})
	defer k.Close()
	arn := k.CreateStreamWith("changes", StreamOptions{Shards: 4})
	c := kinesisClient(k)
	ctx := context.Background()
	out, err := c.PutRecords(ctx, &kinesis.PutRecordsInput{StreamName: aws.String("changes"),
		Records: []kintypes.PutRecordsRequestEntry{rec("a", "one\x00\xff"), rec("b", "two")}})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToInt32(out.FailedRecordCount) != 0 || len(out.Records) != 2 || aws.ToString(out.Records[1].SequenceNumber) == "" {
		t.Fatalf("output %+v", out)
	}
	k.FailRecords(func(r Record) (string, string) {
		if r.PartitionKey == "d" {
			return "ProvisionedThroughputExceededException", "Rate exceeded for shard " + r.ShardID
		}
		return "", ""
	})
	out, err = c.PutRecords(ctx, &kinesis.PutRecordsInput{StreamARN: aws.String(arn),
		Records: []kintypes.PutRecordsRequestEntry{rec("c", "three"), rec("d", "four"), rec("e", "five")}})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToInt32(out.FailedRecordCount) != 1 || aws.ToString(out.Records[1].ErrorCode) != "ProvisionedThroughputExceededException" ||
		aws.ToString(out.Records[0].SequenceNumber) == "" || aws.ToString(out.Records[2].SequenceNumber) == "" {
		t.Fatalf("output %+v", out)
	}
	got := k.Records("changes")
	var keys []string
	for _, r := range got {
		keys = append(keys, r.PartitionKey+"="+string(r.Data))
		if r.SequenceNumber == "" || !strings.HasPrefix(r.ShardID, "shardId-00000000000") {
			t.Errorf("record %+v", r)
		}
	}
	if strings.Join(keys, ",") != "a=one\x00\xff,b=two,c=three,e=five" {
		t.Fatalf("records %q", keys)
	}
	if s1, s2 := got[0].SequenceNumber, got[1].SequenceNumber; len(s1) != len(s2) || s1 >= s2 {
		t.Errorf("sequence numbers %s, %s do not increase", s1, s2)
	}
	if k.Calls("PutRecords") != 2 || k.Rejected() != 0 {
		t.Errorf("calls %d, rejected %d", k.Calls("PutRecords"), k.Rejected())
	}
}

// TestKinesisErrors checks the error answers as the SDK reports them.
func TestKinesisErrors(t *testing.T) {
	k := NewKinesis(Options{MaxRequestSize: 100})
	defer k.Close()
	k.CreateStreamWith("small", StreamOptions{MaxRecordSize: 50})
	ctx := context.Background()
	c := kinesisClient(k)
	put := func(name string, recs ...kintypes.PutRecordsRequestEntry) error {
		_, err := c.PutRecords(ctx, &kinesis.PutRecordsInput{StreamName: aws.String(name), Records: recs})
		return err
	}
	code := func(err error) string {
		var ae smithy.APIError
		if errors.As(err, &ae) {
			return ae.ErrorCode()
		}
		return "<" + err.Error() + ">"
	}
	var notFound *kintypes.ResourceNotFoundException
	if err := put("nope", rec("a", "x")); !errors.As(err, &notFound) {
		t.Errorf("unknown stream: %v", err)
	}
	var throttled *kintypes.ProvisionedThroughputExceededException
	k.Throttle(1)
	if err := put("small", rec("a", "x")); !errors.As(err, &throttled) {
		t.Errorf("throttle: %v", err)
	}
	k.FailStatus(1, 500)
	if err := put("small", rec("a", "x")); code(err) != "InternalFailure" {
		t.Errorf("500: %v", err)
	}
	k.FailStatus(1, 503)
	if err := put("small", rec("a", "x")); code(err) != "ServiceUnavailable" {
		t.Errorf("503: %v", err)
	}
	if err := put("small", rec("a", strings.Repeat("x", 50))); code(err) != "ValidationException" {
		t.Errorf("record over the stream's maximum: %v", err)
	}
	if err := put("small", rec("a", strings.Repeat("x", 40)), rec("b", strings.Repeat("x", 40)), rec("c", strings.Repeat("x", 40))); code(err) != "InvalidArgumentException" {
		t.Errorf("request over the limit: %v", err)
	}
	if err := put("small", rec(strings.Repeat("k", 257), "x")); code(err) != "ValidationException" {
		t.Errorf("partition key too long: %v", err)
	}
	many := make([]kintypes.PutRecordsRequestEntry, 501)
	for i := range many {
		many[i] = rec("k", "")
	}
	if err := put("small", many...); code(err) != "ValidationException" {
		t.Errorf("501 records: %v", err)
	}
	bad := kinesis.NewFromConfig(wrongSecretConfig(k))
	if _, err := bad.PutRecords(ctx, &kinesis.PutRecordsInput{StreamName: aws.String("small"), Records: []kintypes.PutRecordsRequestEntry{rec("a", "x")}}); code(err) != "InvalidSignatureException" || k.Rejected() != 1 {
		t.Errorf("bad signature: %v (rejected %d)", err, k.Rejected())
	}
	if n := len(k.Records("small")); n != 0 {
		t.Errorf("%d records stored after failures", n)
	}
}
