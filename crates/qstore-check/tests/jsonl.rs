//! JSON-lines reading and writing.

use qstore_check::{
    generate_serial_history, History, HistoryReader, HistoryWriter, ObjKey, ReadError, Record,
};

fn parse(text: &str) -> Result<History, ReadError> {
    History::read_jsonl(text.as_bytes())
}

#[test]
fn roundtrip_preserves_history() {
    let h = generate_serial_history(500, 40, 4, 3);
    let mut bytes = Vec::new();
    h.write_jsonl(&mut bytes).unwrap();
    assert_eq!(
        bytes.iter().filter(|&&b| b == b'\n').count(),
        h.txns.len() + h.version_order.len()
    );
    assert_eq!(History::read_jsonl(bytes.as_slice()).unwrap(), h);
}

#[test]
fn streaming_writer_emits_one_line_per_record() {
    let h = generate_serial_history(3, 5, 2, 1);
    let mut w = HistoryWriter::new(Vec::new());
    w.write_txn(&h.txns[0]).unwrap();
    w.write_order(ObjKey::new(1, 7), &[1, 2]).unwrap();
    w.write_record(&Record::Txn(h.txns[1].clone())).unwrap();
    let text = String::from_utf8(w.into_inner()).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(
        lines[1],
        r#"{"type":"order","table":1,"key":7,"versions":[1,2]}"#
    );
    let records: Vec<_> = HistoryReader::new(text.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(records[0], Record::Txn(h.txns[0].clone()));
    assert_eq!(
        records[1],
        Record::Order {
            key: ObjKey::new(1, 7),
            versions: vec![1, 2]
        }
    );
}

#[test]
fn documented_format_parses() {
    let text = concat!(
        r#"{"type":"txn","id":17,"node":2,"status":"committed","reads":[[0,42,0,0]],"writes":[[0,42,1]]}"#,
        "\r\n\n   \n",
        r#"{"type":"txn","id":18,"node":0,"status":"aborted","cause":"conflict","logic":false,"reads":[],"writes":[[0,7,2]],"extra":1}"#,
        "\n",
        r#"{"versions":[17],"key":42,"table":0,"type":"order"}"#,
    );
    let h = parse(text).unwrap();
    assert_eq!(h.txns.len(), 2);
    assert_eq!(h.version_order, vec![(ObjKey::new(0, 42), vec![17])]);
}

#[test]
fn malformed_lines_name_their_line_number() {
    let good = r#"{"type":"order","table":0,"key":1,"versions":[]}"#;
    let cases = [
        (r#"{"type":"foo"}"#, r#"line 3: unknown record type "foo""#),
        (r#"{"type":"txn","id":1,"#, "line 3: EOF while parsing"),
        (
            r#"{"type":"txn","id":0,"node":0,"status":"committed"}"#,
            "line 3: transaction id 0 is reserved",
        ),
        (
            r#"{"type":"txn","id":1,"node":0,"status":"done"}"#,
            "line 3: unknown variant `done`",
        ),
        (
            r#"{"type":"txn","id":1,"status":"committed"}"#,
            r#"line 3: txn record without "node""#,
        ),
        (
            r#"{"type":"txn","id":1,"node":0,"status":"committed","writes":[[0,1,0]]}"#,
            "line 3: T1 writes 0:1 with count 0",
        ),
        (
            r#"{"type":"txn","id":1,"node":0,"status":"committed","reads":[[0,1,2]]}"#,
            "line 3: invalid length 3",
        ),
        (
            r#"{"type":"order","table":70000,"key":1,"versions":[]}"#,
            "line 3: invalid value: integer `70000`",
        ),
        (
            r#"{"type":"order","key":1,"versions":[]}"#,
            r#"line 3: order record without "table""#,
        ),
        (
            "42",
            "line 3: invalid type: integer `42`, expected a history record object",
        ),
    ];
    for (bad, expected) in cases {
        let text = format!("{good}\n\n{bad}\n{good}\n");
        let err = parse(&text).unwrap_err();
        assert_eq!(err.line(), 3, "{bad}");
        assert!(err.to_string().starts_with(expected), "{bad}: got {err}");
    }
}

#[test]
fn invalid_utf8_is_an_error_not_a_panic() {
    let bytes = b"{\"type\":\"t\xffxn\"}\n";
    let err = History::read_jsonl(&bytes[..]).unwrap_err();
    assert_eq!(err.line(), 1);
}

#[test]
fn reader_continues_after_an_error() {
    let text = "nonsense\n{\"type\":\"order\",\"table\":0,\"key\":1,\"versions\":[5]}\n";
    let results: Vec<_> = HistoryReader::new(text.as_bytes()).collect();
    assert_eq!(results.len(), 2);
    assert!(results[0].is_err());
    assert!(results[1].is_ok());
}
