package main

import (
	"context"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

func TestSQSPartialBatch(t *testing.T) {
	env := `{"id":"jobs:82AB","source":"jobs","operationType":"insert","ns":{"db":"app","coll":"jobs"},"documentKey":{"_id":"job-1"},"rules":["start"]}`
	eb := `{"version":"0","id":"e1","detail-type":"app.jobs.insert","source":"changegate.jobs","detail":` + env + `}`
	resp, err := handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
		{MessageId: "m1", Body: env}, {MessageId: "m2", Body: "not json"}, {MessageId: "m3", Body: eb},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BatchItemFailures) != 1 || resp.BatchItemFailures[0].ItemIdentifier != "m2" {
		t.Fatalf("batch item failures = %+v, want only m2", resp.BatchItemFailures)
	}
}
