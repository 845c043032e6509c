"""N-gram speculative decoding against none: the same requests on two engines of the
default model, one with ``speculative="ngram"`` and one without, in one run.

Workloads (greedy, each request's own chat prompt, up to ``--max-new-tokens`` new):
  extraction         single stream: a document of a few hundred tokens (invoices, person
                     records, product sheets) and a JSON schema of string fields the model
                     fills by copying from it; the documents run one after the other
  json_schema        single stream: JSON-schema generation not copied from anything (a
                     fictional profile, a product, an event: typed fields, arrays, a
                     nested object)
  free_text          single stream: prose (a story, explanations), unconstrained
  extraction_batch8  8 extraction requests over 8 different documents, one batch
  extraction_batch32 32 extraction requests (the 8 documents, each asked 4 ways), one batch
Targets (speculative / baseline output tok/s): 1.8, 1.3, 0.95, 1.3; at batch 32, 1.0
(speculation never loses).

The speculative engine measures its pass costs at start-up (``speculative_calibrate``);
``--compare-fixed`` adds a third engine planning with the fixed ``--token-cost`` model
(the planner without start-up calibration), run back to back with the other two.

Both engines stay loaded; per workload each side runs a warm-up (it compiles the
schemas) and then its repeats, one side after the other (``measure`` says why not in
turns). The radix cache is flushed before every run: a cached prompt would leave prefill
out, and a cached output would hand the speculative side the whole answer through the
radix proposer. Figures per workload: median output tok/s of each side (wall time of the
whole workload, prefill included) and their ratio; for single streams also the decode-only
ratio (each request's output after its first token, over its time after the first token);
the acceptance rate and mean accepted tokens per verify row (``get_stats().speculative``
over the timed runs, by source: ``ngram``, and ``grammar`` for text a schema forces);
passes per output token and wall time per pass; and how many requests gave the same text
on both sides in every repeat (greedy: bfloat16 may differ at near-ties, float32 must not).

``--sweep-k`` also runs the extraction workload on an engine with K = 8 whose requests ask
for K = 1, 2, 4, 8 (``speculative_num_tokens`` per request: the same proposals as an
engine built with that K), against the same baseline.

Usage: .venv/bin/python benchmarks/bench_speculative.py [--workloads extraction json_schema
           free_text extraction_batch8] [--repeats 3] [--num-tokens 4] [--dtype auto]
           [--max-new-tokens 128] [--no-adaptive] [--token-cost 0.1] [--sweep-k]
           [--json benchmarks/results/speculative.json]
Prints a table and writes the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import radixlm
from radixlm.runtime.model_store import default_model_dir

RESULTS = Path(__file__).parent / "results" / "speculative.json"
DEFAULT_MODEL = default_model_dir()
SWEEP_K = (1, 2, 4, 8)

# ---------------------------------------------------------------- documents and schemas

INVOICES = [
    """INVOICE
Invoice number: INV-2024-00317
Date: 14 March 2024
Due date: 13 April 2024

From: Harbor Lane Office Supplies Ltd.
Address: 48 Harbor Lane, Portsmouth PO1 3HZ, United Kingdom
Email: billing@harborlane-supplies.co.uk
Phone: +44 23 9287 4410

Bill to: Marlow & Finch Architects
Address: 12 Queen Street, Southampton SO14 3DL, United Kingdom
Email: accounts@marlowfinch.com

Items:
  1. A4 copier paper, 80 gsm, 20 reams at 4.20 GBP = 84.00 GBP
  2. Black toner cartridge TN-2420, 3 units at 56.50 GBP = 169.50 GBP
  3. Desk organiser, walnut, 2 units at 23.75 GBP = 47.50 GBP
  4. Delivery (next working day) = 12.00 GBP

Subtotal: 313.00 GBP
VAT (20%): 62.60 GBP
Total amount due: 375.60 GBP

Payment by bank transfer to Harbor Lane Office Supplies Ltd., sort code 20-45-77,
account 60311942, quoting the invoice number. Late payments incur interest of 2%
per month. Thank you for your business.""",
    """Rechnung / Invoice

Invoice no.: 2024-DE-88142
Invoice date: 2 July 2024
Customer number: K-55190

Supplier: Bergmann Industrietechnik GmbH
Address: Industriestrasse 17, 70565 Stuttgart, Germany
Email: rechnung@bergmann-industrietechnik.de
VAT ID: DE 281 447 903

Customer: Nordlicht Solar AG
Address: Am Hafen 4, 24103 Kiel, Germany
Email: einkauf@nordlicht-solar.de

Pos. Description                         Qty   Unit price   Amount
1    Mounting rail MR-40, 4 m             120   18.90 EUR    2268.00 EUR
2    Stainless clamp set, 50 pcs           30   41.20 EUR    1236.00 EUR
3    Installation on site (hours)          16   72.00 EUR    1152.00 EUR

Net amount: 4656.00 EUR
VAT 19%: 884.64 EUR
Invoice total: 5540.64 EUR

Terms: payable within 30 days of the invoice date without deduction. Please
transfer the invoice total to IBAN DE44 6005 0101 0004 2217 93 and state the
invoice number 2024-DE-88142 as the payment reference.""",
    """Blue Mesa Web Services - Invoice

Invoice #: BMWS-7781
Issued: November 21, 2024
Period: October 1 - October 31, 2024

Billed from: Blue Mesa Web Services LLC, 2210 Canyon Road, Santa Fe, NM 87501, USA
Contact: invoices@bluemesaweb.com, (505) 555-0182

Billed to: Dr. Priya Raman, Raman Family Dental
Address: 905 Cerrillos Road, Suite 3, Santa Fe, NM 87505, USA
Email: office@ramanfamilydental.com

Description                                   Amount
Website hosting, business plan (1 month)      $49.00
Online booking plugin licence                 $19.00
Content updates, 3.5 hours at $65/hour        $227.50
SSL certificate renewal                       $35.00

Total due: $330.50 (no sales tax on services)

Please pay within 15 days. Card payments: bluemesaweb.com/pay, reference BMWS-7781.
Questions about this invoice: invoices@bluemesaweb.com.""",
]

PEOPLE = [
    """EMPLOYEE RECORD - Human Resources, confidential

Full name: Margaret Eleanor Okafor
Employee ID: E-10482
Department: Research and Development
Job title: Senior Materials Engineer
Start date: 6 September 2016
Date of birth: 19 May 1984

Home address: 27 Birchwood Avenue, Leeds LS6 2QA, United Kingdom
Work email: m.okafor@kestrel-materials.com
Personal email: maggie.okafor84@gmail.com
Mobile phone: +44 7700 900 614

Emergency contact: Daniel Okafor (spouse), +44 7700 900 871

Notes: Margaret leads the polymer coatings group of six engineers. She holds a PhD in
materials science from the University of Manchester (2012) and is a chartered
engineer. Annual review completed on 12 January 2024, rating: exceeds expectations.
Eligible for the long-service award in September 2026.""",
    """Patient registration form - Lakeside Medical Centre

Surname: Fernandes
Given names: Tomas Miguel
Date of birth: 03/11/1991
Sex: male
NHS number: 485 777 3456

Address: Flat 4, 19 Lakeside Court, Bristol BS8 4RJ
Telephone: 0117 496 0823
Email: tomas.fernandes@protonmail.com

Registered GP: Dr. Helen Whitcombe
Registration date: 28 February 2025

Allergies: penicillin (rash), peanuts
Current medication: salbutamol inhaler as needed
Occupation: secondary school teacher (physics)
Next of kin: Ana Fernandes (mother), 0117 496 0511

Consent to receive appointment reminders by text message: yes. Preferred language:
English and Portuguese.""",
    """Speaker profile - Northern Data Conference 2025

Name: Kenji Watanabe-Lindqvist
Affiliation: Aurora Analytics, Stockholm
Role: Principal Data Scientist
Email: kenji.wl@aurora-analytics.se
Postal address: Sveavagen 64, 111 34 Stockholm, Sweden
Website: kenjiwl.dev

Talk title: Forecasting Demand for Electric Ferries with Sparse Sensor Data
Session: Thursday 9 October 2025, 14:30, Hall B

Biography: Kenji has spent eleven years building forecasting systems for transport
operators in Japan and Scandinavia. Before Aurora Analytics he worked at the Tokyo
Metropolitan Transport Bureau on passenger-flow models. He studied applied mathematics
at Kyoto University and holds a master's degree in statistics from Uppsala University.
He lives in Stockholm with his family and a very old cat named Mochi.""",
]

PRODUCTS = [
    """PRODUCT DATA SHEET

Product name: AquaPure Countertop Water Filter CF-300
Manufacturer: Riverstone Home Appliances Inc.
Manufacturer address: 1180 Industrial Parkway, Dayton, OH 45414, USA
Support email: support@riverstonehome.com
SKU: RS-CF300-WHT
Release date: 1 April 2023
List price: 129.99 USD

Description: a three-stage countertop filter that connects to a standard kitchen
faucet with the included diverter valve. Stage one removes sediment down to 5
microns, stage two is an activated carbon block for chlorine, taste and odour, and
stage three is an ion-exchange resin that reduces lead and copper.

Specifications:
  Flow rate: 1.9 litres per minute
  Filter life: 3,800 litres or 6 months
  Dimensions: 28 x 14 x 14 cm
  Weight: 1.6 kg
  Colour: white
  Certifications: NSF/ANSI 42, NSF/ANSI 53

Warranty: 2 years, limited. Replacement cartridge: RS-CF300-CART, 34.99 USD.""",
    """Technical sheet - TrailMark X2 GPS Hiking Watch

Model: TrailMark X2
Brand: Fjellstad Outdoor Electronics AS
Company address: Kongens gate 8, 7011 Trondheim, Norway
Contact email: service@fjellstad-outdoor.no
Article number: FJ-X2-GRN
Launch date: 15 May 2024
Retail price: 349.00 EUR

Summary: a rugged GPS watch for hikers and trail runners with offline topographic maps,
barometric altimeter, and a battery that lasts up to 21 days in smartwatch mode or 48
hours with continuous GPS tracking.

Key data:
  Display: 1.3 inch transflective, sapphire glass
  Water resistance: 10 ATM
  Sensors: GPS, GLONASS, Galileo, barometer, compass, heart rate
  Weight: 58 g
  Strap: silicone, olive green, 22 mm

In the box: watch, charging cable, quick start guide. Warranty: 2 years.""",
]

INVOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string"},
        "date": {"type": "string"},
        "seller_name": {"type": "string"},
        "seller_address": {"type": "string"},
        "seller_email": {"type": "string"},
        "customer_name": {"type": "string"},
        "customer_address": {"type": "string"},
        "total_amount": {"type": "string"},
    },
    "required": [
        "invoice_number",
        "date",
        "seller_name",
        "seller_address",
        "seller_email",
        "customer_name",
        "customer_address",
        "total_amount",
    ],
    "additionalProperties": False,
}

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "date": {"type": "string"},
        "address": {"type": "string"},
        "email": {"type": "string"},
        "phone": {"type": "string"},
        "organisation": {"type": "string"},
        "role": {"type": "string"},
    },
    "required": ["name", "date", "address", "email", "phone", "organisation", "role"],
    "additionalProperties": False,
}

PRODUCT_SCHEMA = {
    "type": "object",
    "properties": {
        "product_name": {"type": "string"},
        "manufacturer": {"type": "string"},
        "address": {"type": "string"},
        "email": {"type": "string"},
        "sku": {"type": "string"},
        "release_date": {"type": "string"},
        "price": {"type": "string"},
        "weight": {"type": "string"},
    },
    "required": [
        "product_name",
        "manufacturer",
        "address",
        "email",
        "sku",
        "release_date",
        "price",
        "weight",
    ],
    "additionalProperties": False,
}

# (document, what it is, schema), interleaved so the first three are one of each kind
DOCUMENTS = [
    (INVOICES[0], "invoice", INVOICE_SCHEMA),
    (PEOPLE[0], "record", PERSON_SCHEMA),
    (PRODUCTS[0], "product sheet", PRODUCT_SCHEMA),
    (INVOICES[1], "invoice", INVOICE_SCHEMA),
    (PEOPLE[1], "record", PERSON_SCHEMA),
    (PRODUCTS[1], "product sheet", PRODUCT_SCHEMA),
    (INVOICES[2], "invoice", INVOICE_SCHEMA),
    (PEOPLE[2], "record", PERSON_SCHEMA),
]
NUM_SINGLE_DOCUMENTS = 3  # the single-stream extraction runs the first three

PROFILE_SCHEMA = {
    "type": "object",
    "properties": {
        "username": {"type": "string", "maxLength": 24},
        "full_name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "is_verified": {"type": "boolean"},
        "interests": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 40},
                "city": {"type": "string", "maxLength": 24},
                "country": {"type": "string", "maxLength": 24},
            },
            "required": ["street", "city", "country"],
            "additionalProperties": False,
        },
    },
    "required": ["username", "full_name", "age", "is_verified", "interests", "address"],
    "additionalProperties": False,
}

CATALOG_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "category": {"enum": ["kitchen", "garden", "electronics", "toys", "books"]},
        "price": {"type": "number", "minimum": 0},
        "in_stock": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 5},
        "dimensions": {
            "type": "object",
            "properties": {
                "width_cm": {"type": "number"},
                "height_cm": {"type": "number"},
                "depth_cm": {"type": "number"},
            },
            "required": ["width_cm", "height_cm", "depth_cm"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "category", "price", "in_stock", "tags", "dimensions"],
    "additionalProperties": False,
}

EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 48},
        "date": {"type": "string", "format": "date"},
        "attendees": {"type": "integer", "minimum": 1, "maximum": 5000},
        "speakers": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 32},
                    "topic": {"type": "string", "maxLength": 40},
                },
                "required": ["name", "topic"],
                "additionalProperties": False,
            },
            "maxItems": 3,
        },
        "venue": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 32},
                "city": {"type": "string", "maxLength": 24},
            },
            "required": ["name", "city"],
            "additionalProperties": False,
        },
    },
    "required": ["title", "date", "attendees", "speakers", "venue"],
    "additionalProperties": False,
}

GENERATION_TASKS = [
    ("Generate a fictional user profile for a social network as JSON.", PROFILE_SCHEMA),
    ("Invent a product for an online shop and describe it as JSON.", CATALOG_SCHEMA),
    ("Make up a technology meetup and describe it as JSON.", EVENT_SCHEMA),
]

FREE_TEXT_TASKS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how photosynthesis works, step by step, for a curious twelve-year-old.",
    "Explain why the sky is blue and why sunsets are red.",
]

# ---------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Workload:
    """Requests run one after the other (``batched=False``) or in one ``generate``."""

    name: str
    target: float  # speculative / baseline output tok/s asked for
    batched: bool
    prompts: list[str]
    params: list[dict]


def chat(tokenizer, message: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
    )


ASKED_WAYS = ("", "Please be exact. ", "Answer carefully. ", "No comments, only JSON. ")


def extraction_request(tokenizer, doc: str, kind: str, schema: dict, max_new: int, way: str = ""):
    fields = ", ".join(schema["properties"])
    message = (
        f"Here is a {kind}:\n\n{doc}\n\n{way}Extract these fields from the {kind} above and "
        f"answer with a JSON object, copying each value exactly as written: {fields}."
    )
    params = {"temperature": 0, "max_new_tokens": max_new, "json_schema": json.dumps(schema)}
    return chat(tokenizer, message), params


def make_workloads(tokenizer, max_new: int) -> dict[str, Workload]:
    extraction = [extraction_request(tokenizer, *d, max_new) for d in DOCUMENTS]
    extraction_32 = [
        extraction_request(tokenizer, *d, max_new, way) for way in ASKED_WAYS for d in DOCUMENTS
    ]
    schema_gen = [
        (chat(tokenizer, task), {"temperature": 0, "max_new_tokens": max_new,
                                 "json_schema": json.dumps(schema)})
        for task, schema in GENERATION_TASKS
    ]  # fmt: skip
    prose = [
        (chat(tokenizer, t), {"temperature": 0, "max_new_tokens": max_new}) for t in FREE_TEXT_TASKS
    ]

    def workload(name: str, target: float, batched: bool, requests) -> Workload:
        return Workload(name, target, batched, [p for p, _ in requests], [s for _, s in requests])

    return {
        "extraction": workload("extraction", 1.8, False, extraction[:NUM_SINGLE_DOCUMENTS]),
        "json_schema": workload("json_schema", 1.3, False, schema_gen),
        "free_text": workload("free_text", 0.95, False, prose),
        "extraction_batch8": workload("extraction_batch8", 1.3, True, extraction[:8]),
        "extraction_batch32": workload("extraction_batch32", 1.0, True, extraction_32),
    }


# ---------------------------------------------------------------- measuring


@dataclass
class Counters:
    """The engine counters a run moves: passes, jump-forward tokens, speculation."""

    num_passes: int = 0
    num_jump_forward_tokens: int = 0
    verify_rows: int = 0
    proposed: Counter = field(default_factory=Counter)  # source -> tokens
    accepted: Counter = field(default_factory=Counter)

    @classmethod
    def read(cls, engine) -> Counters:
        stats = engine.get_stats()
        spec = stats.speculative
        return cls(
            stats.num_steps,
            stats.num_jump_forward_tokens,
            spec.verify_rows if spec else 0,
            Counter(spec.proposed if spec else {}),
            Counter(spec.accepted if spec else {}),
        )

    def __sub__(self, other: Counters) -> Counters:  # counters only grow
        return Counters(
            self.num_passes - other.num_passes,
            self.num_jump_forward_tokens - other.num_jump_forward_tokens,
            self.verify_rows - other.verify_rows,
            self.proposed - other.proposed,
            self.accepted - other.accepted,
        )

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.num_passes + other.num_passes,
            self.num_jump_forward_tokens + other.num_jump_forward_tokens,
            self.verify_rows + other.verify_rows,
            self.proposed + other.proposed,
            self.accepted + other.accepted,
        )

    def speculation(self) -> dict:
        num_proposed, num_accepted = sum(self.proposed.values()), sum(self.accepted.values())
        return {
            "verify_rows": self.verify_rows,
            "proposed": dict(self.proposed),
            "accepted": dict(self.accepted),
            "acceptance_rate": num_accepted / num_proposed if num_proposed else 0.0,
            "mean_accept_length": num_accepted / self.verify_rows if self.verify_rows else 0.0,
        }


@dataclass
class Run:
    """One run of a workload on one side, from a flushed cache."""

    wall_s: float
    texts: list[str]
    num_output_tokens: int
    num_decode_tokens: int  # output tokens after each request's first one
    decode_s: float  # each request's time after its first token
    counters: Counters  # what this run moved (engines may be shared between sides)


def run_once(engine, workload: Workload, extra: dict) -> Run:
    params = [{**p, **extra} for p in workload.params]
    engine.flush_cache()
    before = Counters.read(engine)
    start = time.perf_counter()
    if workload.batched:
        outs = engine.generate(workload.prompts, params)
    else:
        outs = [engine.generate(p, s) for p, s in zip(workload.prompts, params, strict=True)]
    wall = time.perf_counter() - start
    counts = [o["meta_info"]["completion_tokens"] for o in outs]
    after_first = [o["meta_info"]["e2e_latency"] - o["meta_info"]["ttft"] for o in outs]
    return Run(
        wall_s=wall,
        texts=[o["text"] for o in outs],
        num_output_tokens=sum(counts),
        num_decode_tokens=sum(n - 1 for n in counts),
        decode_s=sum(after_first),
        counters=Counters.read(engine) - before,
    )


@dataclass
class Side:
    """A way to run the workload: an engine and sampling params added to every request."""

    name: str
    engine: object
    extra: dict = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)


def measure(workload: Workload, sides: list[Side], repeats: int) -> dict:
    """Runs each side's warm-up and then its ``repeats`` back to back. Not in turns: on
    the 2-core VM a run right after the other engine ran is slower than after the same
    engine's own run, even after a short request first (benchmarks/README.md,
    "Speculative decoding"; the cause is not pinned down, perhaps the VM's DAMON pageout
    of idle memory), which in turns costs the shorter speculative runs most."""
    for side in sides:
        run_once(side.engine, workload, side.extra)
        side.runs = [run_once(side.engine, workload, side.extra) for _ in range(repeats)]
    return {s.name: summarize(s, workload) for s in sides}


def summarize(side: Side, workload: Workload) -> dict:
    runs = side.runs
    total = sum((r.counters for r in runs), Counters())
    speculates = side.engine.get_stats().speculative is not None
    result = {
        "tok_s": statistics.median(r.num_output_tokens / r.wall_s for r in runs),
        "runs_tok_s": [r.num_output_tokens / r.wall_s for r in runs],
        "decode_tok_s": None,
        "output_tokens": runs[-1].num_output_tokens,
        "passes_per_token": total.num_passes / sum(r.num_output_tokens for r in runs),
        "ms_per_pass": 1e3 * sum(r.wall_s for r in runs) / total.num_passes,
        "jump_forward_tokens": total.num_jump_forward_tokens,
        "speculative": total.speculation() if speculates else None,
        "texts": runs[-1].texts,
    }
    if not workload.batched:
        rates = [r.num_decode_tokens / r.decode_s for r in runs]
        result["decode_tok_s"] = statistics.median(rates)
    return result


def num_identical(base: Side, other: Side) -> int:
    """Requests whose text is the same on both sides in every repeat."""
    same = [
        all(a.texts[i] == b.texts[i] for a, b in zip(base.runs, other.runs, strict=True))
        for i in range(len(base.runs[0].texts))
    ]
    return sum(same)


def compare(workload: Workload, base: Side, spec: Side, stats: dict) -> dict:
    b, s = stats[base.name], stats[spec.name]
    decode = None
    if b["decode_tok_s"] and s["decode_tok_s"]:
        decode = s["decode_tok_s"] / b["decode_tok_s"]
    return {
        "target": workload.target,
        "ratio": s["tok_s"] / b["tok_s"],
        "decode_ratio": decode,
        "identical": num_identical(base, spec),
        "requests": len(workload.prompts),
        "baseline": b,
        "speculative": s,
    }


# ---------------------------------------------------------------- the run


def cpu_description() -> dict:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    flags = sorted(set(re.findall(r"\b(avx512[a-z_0-9]*|amx[a-z_0-9]*)\b", info)))
    return {"model": name.group(1) if name else None, "cores": os.cpu_count(), "flags": flags}


def build_engine(args, **options):
    return radixlm.Engine(
        model_path=str(args.model_path), dtype=args.dtype, max_total_tokens=16384, **options
    )


def spec_options(args, num_tokens: int) -> dict:
    return {
        "speculative": "ngram",
        "speculative_num_tokens": num_tokens,
        "speculative_adaptive": args.adaptive,
        "speculative_token_cost": args.token_cost,
        "speculative_calibrate": args.calibrate,
    }


def print_table(results: dict) -> None:
    head = ["workload", "base tok/s", "spec tok/s", "ratio", "target", "decode ratio",
            "acceptance", "accepted/verify", "identical"]  # fmt: skip
    print("\n" + " | ".join(head))
    for name, r in results.items():
        if "fixed" in r:
            fixed = r["fixed"]
            print(
                f"{name}, fixed cost model | {r['baseline']['tok_s']:.1f} | "
                f"{fixed['speculative']['tok_s']:.1f} | {fixed['ratio']:.2f} | | | "
                f"{fixed['speculative']['speculative']['acceptance_rate']:.0%} | "
                f"{fixed['speculative']['speculative']['mean_accept_length']:.2f} | "
                f"{fixed['identical']}/{fixed['requests']}"
            )
        spec = r["speculative"]["speculative"]
        decode = f"{r['decode_ratio']:.2f}" if r["decode_ratio"] else "-"
        row = [
            name,
            f"{r['baseline']['tok_s']:.1f}",
            f"{r['speculative']['tok_s']:.1f}",
            f"{r['ratio']:.2f}",
            f">= {r['target']}",
            decode,
            f"{spec['acceptance_rate']:.0%}",
            f"{spec['mean_accept_length']:.2f}",
            f"{r['identical']}/{r['requests']}",
        ]
        print(" | ".join(row))
    print("\nwhere time goes: passes per output token and wall ms per pass (prefill included)")
    print("workload | base passes/token | spec passes/token | base ms/pass | spec ms/pass")
    for name, r in results.items():
        b, s = r["baseline"], r["speculative"]
        print(
            f"{name} | {b['passes_per_token']:.2f} | {s['passes_per_token']:.2f} | "
            f"{b['ms_per_pass']:.1f} | {s['ms_per_pass']:.1f}"
        )


def print_sweep(sweep: dict) -> None:
    print("\nextraction, K swept (engine K = 8, per-request speculative_num_tokens)")
    print("K | spec tok/s | ratio | acceptance | accepted/verify | passes/token | ms/pass")
    for k, r in sweep["sides"].items():
        spec = r["speculative"] or {"acceptance_rate": 0.0, "mean_accept_length": 0.0}
        print(
            f"{k} | {r['tok_s']:.1f} | {r['tok_s'] / sweep['baseline_tok_s']:.2f} | "
            f"{spec['acceptance_rate']:.0%} | {spec['mean_accept_length']:.2f} | "
            f"{r['passes_per_token']:.2f} | {r['ms_per_pass']:.1f}"
        )


def run_sweep(args, workload: Workload, baseline) -> dict:
    engine = build_engine(args, **spec_options(args, max(SWEEP_K)))
    try:
        base = Side("baseline", baseline)
        sides = [base] + [Side(f"K={k}", engine, {"speculative_num_tokens": k}) for k in SWEEP_K]
        stats = measure(workload, sides, args.repeats)
    finally:
        engine.shutdown()
    for s in stats.values():
        s.pop("texts")
    return {
        "baseline_tok_s": stats.pop("baseline")["tok_s"],
        "sides": stats,
        "identical": {s.name: num_identical(base, s) for s in sides[1:]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", type=Path, default=DEFAULT_MODEL)
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=[
            "extraction",
            "json_schema",
            "free_text",
            "extraction_batch8",
            "extraction_batch32",
        ],
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-tokens", type=int, default=4, help="K of the speculative side")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--token-cost", type=float, default=0.1)
    parser.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the speculative engine measures its pass costs at start-up",
    )
    parser.add_argument(
        "--compare-fixed",
        action="store_true",
        help="a third engine plans with the fixed --token-cost model (no calibration)",
    )
    parser.add_argument("--sweep-k", action="store_true", help="extraction at K = 1, 2, 4, 8")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()

    load_before = os.getloadavg()
    started = time.perf_counter()
    baseline = build_engine(args)
    speculative = build_engine(args, **spec_options(args, args.num_tokens))
    pass_cost = dataclasses.asdict(speculative._rt.scheduler.speculator.pass_cost)
    print(f"speculative engine's pass costs (s): {pass_cost}", flush=True)
    fixed = None
    if args.compare_fixed:
        options = {**spec_options(args, args.num_tokens), "speculative_calibrate": False}
        fixed = build_engine(args, **options)
    try:
        workloads = make_workloads(baseline.tokenizer, args.max_new_tokens)
        unknown = set(args.workloads) - set(workloads)
        if unknown:
            parser.error(f"unknown workloads {sorted(unknown)}; known: {sorted(workloads)}")
        results = {}
        for name in args.workloads:
            base, spec = Side("baseline", baseline), Side("speculative", speculative)
            sides = [base, spec] + ([Side("fixed", fixed)] if fixed else [])
            stats = measure(workloads[name], sides, args.repeats)
            results[name] = compare(workloads[name], base, spec, stats)
            if fixed:
                results[name]["fixed"] = compare(workloads[name], base, sides[2], stats)
            print(f"{name}: ratio {results[name]['ratio']:.2f}", flush=True)
        sweep = run_sweep(args, workloads["extraction"], baseline) if args.sweep_k else None
    finally:
        baseline.shutdown()
        speculative.shutdown()
        if fixed:
            fixed.shutdown()
    print_table(results)
    if sweep:
        print_sweep(sweep)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_description(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "wall_s": time.perf_counter() - started,
        "model": str(args.model_path),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "pass_cost": pass_cost,
        "results": results,
        "sweep_k": sweep,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
