//! The query worker's copy of the int8 export, with its weight products done
//! in int8.
//!
//! The export stores each linear layer's weights as int8 with one float scale
//! per output column, and turns them back into floats inside the graph
//! (`Cast`, then `Mul` by the scales) before an ordinary float `MatMul`: ONNX
//! Runtime folds that into float weights at load, so every product runs in
//! f32. Here each such `MatMul` becomes ONNX Runtime's `DynamicQuantizeMatMul`
//! on the same int8 weights and scales: the activations are quantized to 8
//! bits at each call and the product runs on integer instructions. The
//! weights are exactly the published ones; only the activations are rounded.
//!
//! The rewrite works on the protobuf wire format of the pinned file and
//! copies every byte it does not change, so nothing the graph holds is lost
//! to a partial schema: it decodes only the fields it reads (a node's inputs,
//! outputs, name, type and `Cast` target; a tensor's name, type and shape),
//! replaces the matched products' nodes, drops the `Cast` and `Mul` nodes
//! that fed only them, and adds the `com.microsoft` operator set.

use std::collections::HashMap;

use anyhow::{Context, bail, ensure};
use prost::Message;
use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};

/// Field numbers of onnx.proto that the rewrite reads or writes.
const MODEL_GRAPH: u32 = 7;
const MODEL_OPSET_IMPORT: u32 = 8;
const GRAPH_NODE: u32 = 1;
const GRAPH_INITIALIZER: u32 = 5;
/// `TensorProto.DataType` values.
const FLOAT: i64 = 1;
const INT8: i32 = 3;
const CONTRIB_DOMAIN: &str = "com.microsoft";

#[derive(Clone, PartialEq, Message)]
struct Node {
    #[prost(string, repeated, tag = "1")]
    input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    output: Vec<String>,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(string, tag = "4")]
    op_type: String,
    #[prost(message, repeated, tag = "5")]
    attribute: Vec<Attribute>,
    #[prost(string, tag = "7")]
    domain: String,
}

#[derive(Clone, PartialEq, Message)]
struct Attribute {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int64, tag = "3")]
    i: i64,
}

/// A tensor's head: its data is skipped when decoding.
#[derive(Clone, PartialEq, Message)]
struct TensorHead {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    data_type: i32,
    #[prost(string, tag = "8")]
    name: String,
}

#[derive(Clone, PartialEq, Message)]
struct OperatorSet {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(int64, tag = "2")]
    version: i64,
}

/// One field of a message: its number, its bytes key included, and the
/// payload of a length-delimited field (empty for the others).
struct Field<'a> {
    number: u32,
    whole: &'a [u8],
    payload: &'a [u8],
}

/// The first `n` bytes of `rest`, which moves past them.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> anyhow::Result<&'a [u8]> {
    ensure!(rest.len() >= n, "a field runs past the end of its message");
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

/// The fields of one message, in order.
fn fields(message: &[u8]) -> anyhow::Result<Vec<Field<'_>>> {
    let mut rest = message;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let start = rest;
        let (number, wire) = decode_key(&mut rest)?;
        let payload = match wire {
            WireType::Varint => {
                decode_varint(&mut rest)?;
                &[][..]
            }
            WireType::SixtyFourBit => take(&mut rest, 8).map(|_| &[][..])?,
            WireType::ThirtyTwoBit => take(&mut rest, 4).map(|_| &[][..])?,
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut rest)?)?;
                take(&mut rest, len)?
            }
            WireType::StartGroup | WireType::EndGroup => bail!("a protobuf group, which ONNX does not use"),
        };
        out.push(Field { number, whole: &start[..start.len() - rest.len()], payload });
    }
    Ok(out)
}

fn put_message(out: &mut Vec<u8>, number: u32, payload: &[u8]) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// `model` (an ONNX file) with every float product by dequantized int8
/// weights done in int8; also returns how many products were changed.
pub fn rewrite(model: &[u8]) -> anyhow::Result<(Vec<u8>, usize)> {
    let top = fields(model).context("reading the model")?;
    let mut graphs = top.iter().filter(|f| f.number == MODEL_GRAPH);
    let graph = graphs.next().context("the model has no graph")?;
    ensure!(graphs.next().is_none(), "the model has two graphs");
    let parts = fields(graph.payload).context("reading the graph")?;

    let mut nodes: Vec<(usize, Node)> = Vec::new();
    let mut tensors: HashMap<String, TensorHead> = HashMap::new();
    for (i, f) in parts.iter().enumerate() {
        match f.number {
            GRAPH_NODE => nodes.push((i, Node::decode(f.payload).context("reading a node")?)),
            GRAPH_INITIALIZER => {
                let t = TensorHead::decode(f.payload).context("reading an initializer")?;
                tensors.insert(t.name.clone(), t);
            }
            _ => {}
        }
    }
    // Output name -> (field index, node).
    let producer: HashMap<&str, (usize, &Node)> =
        nodes.iter().flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), (*i, n)))).collect();
    let mut uses: HashMap<&str, usize> = HashMap::new();
    for (_, n) in &nodes {
        for input in &n.input {
            *uses.entry(input.as_str()).or_default() += 1;
        }
    }
    let single_use = |name: &str| uses.get(name) == Some(&1);
    let op = |name: &str, op_type: &str, inputs: usize| {
        producer
            .get(name)
            .copied()
            .filter(|(_, n)| n.op_type == op_type && n.domain.is_empty() && n.input.len() == inputs)
    };

    // Field index of a node -> its replacement; field indexes of the nodes to drop.
    let mut replaced: HashMap<usize, Node> = HashMap::new();
    let mut dropped: Vec<usize> = Vec::new();
    for (i, n) in &nodes {
        if n.op_type != "MatMul" || !n.domain.is_empty() || n.input.len() != 2 {
            continue;
        }
        let weights = n.input[1].as_str();
        let Some((mul_at, mul)) = op(weights, "Mul", 2).filter(|_| single_use(weights)) else { continue };
        let (dequantized, scale) = (mul.input[0].as_str(), mul.input[1].as_str());
        let Some((cast_at, cast)) = op(dequantized, "Cast", 1).filter(|_| single_use(dequantized)) else { continue };
        let to_float = cast.attribute.iter().any(|a| a.name == "to" && a.i == FLOAT);
        let (Some(q), Some(s)) = (tensors.get(&cast.input[0]), tensors.get(scale)) else { continue };
        // int8 [K, N] weights with one float scale per output column, [1, N]:
        // DynamicQuantizeMatMul takes exactly that as its B and b_scale.
        let per_column =
            q.data_type == INT8 && q.dims.len() == 2 && i64::from(s.data_type) == FLOAT && s.dims == [1, q.dims[1]];
        if !to_float || !per_column {
            continue;
        }
        replaced.insert(
            *i,
            Node {
                input: vec![n.input[0].clone(), cast.input[0].clone(), scale.to_string()],
                output: n.output.clone(),
                name: n.name.clone(),
                op_type: "DynamicQuantizeMatMul".into(),
                attribute: Vec::new(),
                domain: CONTRIB_DOMAIN.into(),
            },
        );
        dropped.extend([mul_at, cast_at]);
    }

    let mut new_graph = Vec::with_capacity(graph.payload.len());
    for (i, f) in parts.iter().enumerate() {
        if let Some(node) = replaced.get(&i) {
            put_message(&mut new_graph, GRAPH_NODE, &node.encode_to_vec());
        } else if !dropped.contains(&i) {
            new_graph.extend_from_slice(f.whole);
        }
    }
    let mut has_contrib = false;
    let mut out = Vec::with_capacity(model.len());
    for f in &top {
        if f.number == MODEL_GRAPH {
            put_message(&mut out, MODEL_GRAPH, &new_graph);
        } else {
            if f.number == MODEL_OPSET_IMPORT {
                has_contrib |= OperatorSet::decode(f.payload)?.domain == CONTRIB_DOMAIN;
            }
            out.extend_from_slice(f.whole);
        }
    }
    if !has_contrib {
        let set = OperatorSet { domain: CONTRIB_DOMAIN.into(), version: 1 };
        put_message(&mut out, MODEL_OPSET_IMPORT, &set.encode_to_vec());
    }
    Ok((out, replaced.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op_type: &str, input: &[&str], output: &str, attribute: Vec<Attribute>) -> Node {
        Node {
            input: input.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            name: format!("{op_type}_{output}"),
            op_type: op_type.into(),
            attribute,
            domain: String::new(),
        }
    }

    fn tensor(name: &str, data_type: i32, dims: &[i64]) -> TensorHead {
        TensorHead { dims: dims.to_vec(), data_type, name: name.into() }
    }

    /// A model with one dequantized weight product, one product of two
    /// activations, and fields the rewrite does not read.
    fn model() -> Vec<u8> {
        let to_float = vec![Attribute { name: "to".into(), i: FLOAT }];
        let mut graph = Vec::new();
        for n in [
            node("Cast", &["q"], "deq", to_float),
            node("Mul", &["deq", "s"], "w", vec![]),
            node("MatMul", &["x", "w"], "y", vec![]),
            node("MatMul", &["y", "x"], "z", vec![]),
        ] {
            put_message(&mut graph, GRAPH_NODE, &n.encode_to_vec());
        }
        for t in [tensor("q", INT8, &[4, 3]), tensor("s", FLOAT as i32, &[1, 3])] {
            put_message(&mut graph, GRAPH_INITIALIZER, &t.encode_to_vec());
        }
        put_message(&mut graph, 2, b"the graph's name");
        let mut model = Vec::new();
        encode_key(1, WireType::Varint, &mut model);
        encode_varint(8, &mut model);
        put_message(&mut model, MODEL_GRAPH, &graph);
        put_message(
            &mut model,
            MODEL_OPSET_IMPORT,
            &OperatorSet { domain: String::new(), version: 17 }.encode_to_vec(),
        );
        model
    }

    #[test]
    fn a_dequantized_weight_product_becomes_an_int8_product_and_the_rest_is_kept() {
        let before = model();
        let (after, changed) = rewrite(&before).unwrap();
        assert_eq!(changed, 1);
        let top = fields(&after).unwrap();
        let graph = fields(top.iter().find(|f| f.number == MODEL_GRAPH).unwrap().payload).unwrap();
        let nodes: Vec<Node> =
            graph.iter().filter(|f| f.number == GRAPH_NODE).map(|f| Node::decode(f.payload).unwrap()).collect();
        let ops: Vec<(&str, &str, Vec<&str>)> = nodes
            .iter()
            .map(|n| (n.domain.as_str(), n.op_type.as_str(), n.input.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            ops,
            [(CONTRIB_DOMAIN, "DynamicQuantizeMatMul", vec!["x", "q", "s"]), ("", "MatMul", vec!["y", "x"])]
        );
        assert_eq!(nodes[0].output, ["y"]);
        // The initializers, the graph's name and the model's other fields, byte for byte.
        let kept = |m: &[u8], number: u32| -> Vec<Vec<u8>> {
            fields(m).unwrap().iter().filter(|f| f.number == number).map(|f| f.whole.to_vec()).collect()
        };
        let graph_of = |m: &[u8]| fields(m).unwrap().iter().find(|f| f.number == MODEL_GRAPH).unwrap().payload.to_vec();
        for number in [GRAPH_INITIALIZER, 2] {
            assert_eq!(kept(&graph_of(&after), number), kept(&graph_of(&before), number));
        }
        assert_eq!(kept(&after, 1), kept(&before, 1));
        let sets: Vec<OperatorSet> = top
            .iter()
            .filter(|f| f.number == MODEL_OPSET_IMPORT)
            .map(|f| OperatorSet::decode(f.payload).unwrap())
            .collect();
        assert_eq!(
            sets.iter().map(|s| (s.domain.as_str(), s.version)).collect::<Vec<_>>(),
            [("", 17), (CONTRIB_DOMAIN, 1)]
        );
        // Nothing left to change the second time.
        let (again, changed) = rewrite(&after).unwrap();
        assert_eq!(changed, 0);
        assert_eq!(again, after);
    }

    #[test]
    fn weights_that_are_not_per_column_int8_are_left_alone() {
        let mut graph = Vec::new();
        let to_float = vec![Attribute { name: "to".into(), i: FLOAT }];
        for n in [
            node("Cast", &["q"], "deq", to_float),
            node("Mul", &["deq", "s"], "w", vec![]),
            node("MatMul", &["x", "w"], "y", vec![]),
        ] {
            put_message(&mut graph, GRAPH_NODE, &n.encode_to_vec());
        }
        // One scale for the whole tensor: not the shape DynamicQuantizeMatMul is given here.
        for t in [tensor("q", INT8, &[4, 3]), tensor("s", FLOAT as i32, &[1])] {
            put_message(&mut graph, GRAPH_INITIALIZER, &t.encode_to_vec());
        }
        let mut model = Vec::new();
        put_message(&mut model, MODEL_GRAPH, &graph);
        assert_eq!(rewrite(&model).unwrap().1, 0);
    }

    #[test]
    fn a_cut_file_is_an_error() {
        let m = model();
        assert!(rewrite(&m[..m.len() - 3]).is_err());
        assert!(rewrite(&[0x3a, 0x05, 0x01]).is_err());
    }
}
