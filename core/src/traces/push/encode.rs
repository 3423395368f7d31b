//! The push's request body: the spans the `otlp-json` export writes, as the same document
//! (`ExportTraceServiceRequest`), read through OTLP/JSON's own mapping (hex ids, 64-bit
//! integers as strings: opentelemetry-proto's serde) and encoded as protobuf, so the pushed
//! spans are the exported ones, byte for byte in every field.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::Value;

use crate::traces::otlp;

/// One request of `spans` (each as `otlp::span` writes it), protobuf-encoded.
pub(super) fn request(spans: &[Value]) -> Result<Vec<u8>, serde_json::Error> {
    let mut document = otlp::document_head();
    for (i, span) in spans.iter().enumerate() {
        if i > 0 {
            document.push(',');
        }
        document.push_str(&span.to_string());
    }
    document.push_str(otlp::DOCUMENT_TAIL);
    let request: ExportTraceServiceRequest = serde_json::from_str(&document)?;
    Ok(request.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::any_value;

    #[test]
    fn spans_keep_their_ids_and_attributes_in_protobuf() {
        let span = serde_json::json!({
            "traceId": "0193c2f07a1e7c559b1d3e4f5a6b7c8d",
            "spanId": "9b1d3e4f5a6b7c8d",
            "name": "chat gpt-4o-mini",
            "kind": 3,
            "startTimeUnixNano": "1763999999580000000",
            "endTimeUnixNano": "1764000000000000000",
            "attributes": [
                {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "24"}},
                {"key": "gen_ai.request.model", "value": {"stringValue": "gpt-4o-mini"}},
            ],
            "status": {"code": 1},
        });
        let bytes = request(&[span.clone(), span]).unwrap();
        let decoded = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        let spans = &decoded.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 2);
        assert_eq!(
            hex::encode(&spans[0].trace_id),
            "0193c2f07a1e7c559b1d3e4f5a6b7c8d"
        );
        assert_eq!(hex::encode(&spans[0].span_id), "9b1d3e4f5a6b7c8d");
        assert_eq!(spans[0].end_time_unix_nano, 1_764_000_000_000_000_000);
        assert_eq!(spans[0].kind, 3);
        let tokens = spans[0]
            .attributes
            .iter()
            .find(|a| a.key == "gen_ai.usage.input_tokens")
            .unwrap();
        assert_eq!(
            tokens.value.as_ref().and_then(|v| v.value.clone()),
            Some(any_value::Value::IntValue(24))
        );
    }
}
