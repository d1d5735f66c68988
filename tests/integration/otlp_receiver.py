#!/usr/bin/env python3
"""A small OTLP metrics collector for tests: otlp_receiver.py grpc|http OUT.jsonl

Listens on 127.0.0.1 (port 0), prints "listening on port N", and appends one JSON line per
export to OUT.jsonl: {"protocol": ..., "content_type": ..., "path": ..., "metrics": {...}}
where metrics maps each metric name to {"kind": "sum"|"gauge"|"histogram", "monotonic",
"temporality", "points": [{"attrs": {...}, "value" | "count", "sum", "bucket_counts",
"explicit_bounds"}]} and "service" is the resource's service.name.

Protobuf bodies (gRPC and http/protobuf) are decoded here by the field numbers of the
published OTLP protos (opentelemetry-proto: collector/metrics/v1, metrics/v1, common/v1,
resource/v1) with a wire-format reader of its own, independent of the server's generated
code; JSON bodies with the OTLP/JSON mapping (camelCase, 64-bit integers as strings).
The line is written before the export is answered, so once the server has finished an
export the line is in the file."""
import json
import struct
import sys
import threading


# ---- protobuf wire reader
def _varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if not c & 0x80:
            return v, i


def fields(b):
    """[(field number, wire type, value)]: varint -> int, 64-bit/32-bit -> bytes, len -> bytes"""
    out, i = [], 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 1:
            v, i = b[i : i + 8], i + 8
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = b[i : i + n], i + n
        elif wt == 5:
            v, i = b[i : i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        out.append((num, wt, v))
    return out


def f64(v):
    return struct.unpack("<d", v)[0]


def u64(v):
    return struct.unpack("<Q", v)[0]


def packed_fixed64(v, conv):
    return [conv(v[k : k + 8]) for k in range(0, len(v), 8)]


def any_value(b):  # common.v1.AnyValue
    for num, wt, v in fields(b):
        if num == 1:
            return v.decode()
        if num == 2:
            return bool(v)
        if num == 3:
            return v - (1 << 64) if v >= 1 << 63 else v
        if num == 4:
            return f64(v)
    return None


def key_value(b):  # common.v1.KeyValue {key = 1, value = 2}
    k = val = None
    for num, wt, v in fields(b):
        if num == 1:
            k = v.decode()
        elif num == 2:
            val = any_value(v)
    return k, val


def number_point(b):  # NumberDataPoint {attributes = 7, start = 2, time = 3, as_double = 4, as_int = 6}
    p = {"attrs": {}}
    for num, wt, v in fields(b):
        if num == 7:
            k, val = key_value(v)
            p["attrs"][k] = val
        elif num == 2:
            p["start"] = u64(v)
        elif num == 3:
            p["time"] = u64(v)
        elif num == 4:
            p["value"] = f64(v)
        elif num == 6:
            p["value"] = struct.unpack("<q", v)[0]
    return p


def hist_point(b):  # HistogramDataPoint {attributes = 9, count = 4, sum = 5, bucket_counts = 6, explicit_bounds = 7}
    p = {"attrs": {}, "bucket_counts": [], "explicit_bounds": []}
    for num, wt, v in fields(b):
        if num == 9:
            k, val = key_value(v)
            p["attrs"][k] = val
        elif num == 2:
            p["start"] = u64(v)
        elif num == 3:
            p["time"] = u64(v)
        elif num == 4:
            p["count"] = u64(v)
        elif num == 5:
            p["sum"] = f64(v)
        elif num == 6:
            p["bucket_counts"] += packed_fixed64(v, u64) if wt == 2 else [u64(v)]
        elif num == 7:
            p["explicit_bounds"] += packed_fixed64(v, f64) if wt == 2 else [f64(v)]
    return p


def metric(b):  # Metric {name = 1, description = 2, unit = 3, gauge = 5, sum = 7, histogram = 9}
    m = {"points": []}
    name = None
    for num, wt, v in fields(b):
        if num == 1:
            name = v.decode()
        elif num in (5, 7, 9):
            m["kind"] = {5: "gauge", 7: "sum", 9: "histogram"}[num]
            for n2, w2, v2 in fields(v):  # data_points = 1, temporality = 2, is_monotonic = 3
                if n2 == 1:
                    m["points"].append(hist_point(v2) if num == 9 else number_point(v2))
                elif n2 == 2:
                    m["temporality"] = v2
                elif n2 == 3:
                    m["monotonic"] = bool(v2)
    return name, m


def decode_pb(body):  # ExportMetricsServiceRequest {resource_metrics = 1}
    out = {"metrics": {}, "service": None}
    for num, wt, rm in fields(body):
        if num != 1:
            continue
        for n2, w2, v2 in fields(rm):  # ResourceMetrics {resource = 1, scope_metrics = 2}
            if n2 == 1:
                for n3, w3, kv in fields(v2):  # Resource {attributes = 1}
                    if n3 == 1:
                        k, val = key_value(kv)
                        if k == "service.name":
                            out["service"] = val
            elif n2 == 2:
                for n3, w3, v3 in fields(v2):  # ScopeMetrics {scope = 1, metrics = 2}
                    if n3 == 2:
                        name, m = metric(v3)
                        out["metrics"][name] = m
    return out


def decode_json(body):
    d = json.loads(body)
    out = {"metrics": {}, "service": None}
    for rm in d.get("resourceMetrics", []):
        for kv in rm.get("resource", {}).get("attributes", []):
            if kv["key"] == "service.name":
                out["service"] = kv["value"].get("stringValue")
        for sm in rm.get("scopeMetrics", []):
            for jm in sm.get("metrics", []):
                m = {"points": []}
                for kind in ("gauge", "sum", "histogram"):
                    if kind in jm:
                        data = jm[kind]
                        m["kind"] = kind
                        if "aggregationTemporality" in data:
                            m["temporality"] = data["aggregationTemporality"]
                        if "isMonotonic" in data:
                            m["monotonic"] = data["isMonotonic"]
                        for p in data.get("dataPoints", []):
                            q = {"attrs": {a["key"]: a["value"].get("stringValue") for a in p.get("attributes", [])}}
                            if kind == "histogram":
                                q["count"] = int(p["count"])
                                q["sum"] = p.get("sum", 0)
                                q["bucket_counts"] = [int(x) for x in p.get("bucketCounts", [])]
                                q["explicit_bounds"] = p.get("explicitBounds", [])
                            else:
                                q["value"] = p.get("asDouble", int(p.get("asInt", 0)))
                            m["points"].append(q)
                out["metrics"][jm["name"]] = m
    return out


lock = threading.Lock()


def record(out_path, protocol, content_type, path, decoded):
    decoded.update({"protocol": protocol, "content_type": content_type, "path": path})
    with lock, open(out_path, "a") as f:
        f.write(json.dumps(decoded) + "\n")
        f.flush()


def serve_grpc(out_path):
    from concurrent import futures

    import grpc

    def export(request, context):  # raw bytes: no deserializer
        md = dict(context.invocation_metadata())
        decoded = decode_pb(request)
        decoded["cluster_token"] = md.get("pf-cluster-token")  # must never reach a collector
        record(out_path, "grpc", md.get("content-type", "application/grpc"),
               "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export", decoded)
        return b""  # ExportMetricsServiceResponse{} (full success)

    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.metrics.v1.MetricsService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening on port {port}", flush=True)
    server.wait_for_termination()


def serve_http(out_path):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            ct = self.headers.get("Content-Type", "")
            if self.path.endswith("/v1/metrics"):
                decoded = decode_pb(body) if ct == "application/x-protobuf" else decode_json(body)
                record(out_path, "http", ct, self.path, decoded)
                self.send_response(200)
                self.send_header("Content-Type", ct)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(f"listening on port {srv.server_address[1]}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    {"grpc": serve_grpc, "http": serve_http}[sys.argv[1]](sys.argv[2])
