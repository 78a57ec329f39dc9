"""Texts the tokenizer fixtures are generated from (shared by the fixture scripts).

Only the inputs live here; every expected output comes from llama.cpp
(``scripts/make_tokenizer_fixtures.py``). Runs on any Python 3 (no third-party imports).
"""

from __future__ import annotations

import random

SPECIAL_LIKE = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad><unk><mask>",
    "<unused0><unused17><unused6241>",
    "[multimodal]<start_of_image><end_of_image>",
    "<s></s><unk>",
    "<|im_start|",
    "<|im_start|>>",
    "<<|im_end|>>",
    "< |im_end|>",
    "<|IM_END|>",
    "<|im_end |>",
    "<start_of_turn >",
    "<unused99999>",
    "<0x41><0x0A>",
    "<|endoftext|><|endoftext|><|endoftext|>",
    "text<|im_end|>text",
    "  <|im_end|>  ",
    "\n<end_of_turn>\n",
    "<reponame>repo<file_sep>x.py\n<filename>",
    "<|fim_prefix|>def f(<|fim_suffix|>):<|fim_middle|>",
    "<think>hmm</think>",
    "[INST] hi [/INST]",
    "<<SYS>>sys<</SYS>>",
    "<tool_call>{}</tool_call>",
    "<<<<>>>>",
    "<|||>",
]

CORPUS = [
    "",
    " ",
    "a",
    "Hello world",
    " Hello world",
    "Hello, world! How are you doing today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right; they've said it'll work, and we'd agree. DON'T, WON'T, I'LL",
    "It's 3:45pm on 2024-01-15 and the price is $1,234.56 (≈ €1.130,00).",
    "Ünïcödé àçcéñts: Ærøskøbing, Straße, façade, naïve, coöperate, Œuvre",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣٤٥٦٧٨٩٠.",
    "שלום עולם! זה טקסט בעברית.",
    "नमस्ते दुनिया! यह हिन्दी में लिखा गया है।",
    "হ্যালো বিশ্ব! এটি বাংলা লেখা।",
    "สวัสดีชาวโลก! ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "你好，世界！这是一个中文句子，包含标点符号。",
    "こんにちは世界！これは日本語の文です。カタカナとひらがなと漢字。",
    "안녕하세요 세계! 한국어 문장입니다.",
    "Xin chào thế giới! Tiếng Việt có nhiều dấu.",
    "Merhaba Dünya! İstanbul'da ığdır çok güzel.",
    "გამარჯობა მსოფლიო! Բարև աշխարհ! ሰላም ልዑል!",
    "வணக்கம் உலகம்! ಹಲೋ ವರ್ಲ್ಡ್! హలో వరల్డ్!",
    "កាន់តែពិសេសអាចខលចេញ ສະບາຍດີ ཀུན་ལ་བདེ་ལེགས།",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'int main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n',
    "const f = (a, b) => { return a ?? b; }; // arrow\nlet x = `tmpl ${f(1, 2)}`;",
    '<html><body><div class="x">Hi &amp; bye</div></body></html>',
    '{"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b\\"c"}}',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "# Title\n\n- item 1\n- item 2\n\n```python\nprint('x')\n```\n",
    "    indented\n\tTabbed\n\t\tDouble\n        eight spaces",
    "a  b   c    d     e      f       g        h",
    " " * 2,
    " " * 3,
    " " * 4,
    " " * 7,
    " " * 16,
    " " * 31,
    " " * 32,
    " " * 33,
    " " * 100,
    "\t" * 5,
    "\n" * 3,
    "\n" * 31,
    "\n" * 32,
    "\n" * 40,
    "\r\n\r\n",
    " \t \n \r\n \x0b \x0c ",
    "line1\nline2\r\nline3\rline4",
    "\u00a0nbsp\u2003em\u3000ideographic\u2028ls\u2029ps\u200bzw\u0085nel",
    "trailing space ",
    "trailing spaces   ",
    "   leading spaces",
    "\n\nleading newlines",
    "0",
    "12",
    "123",
    "1234",
    "12345",
    "1234567890123456789",
    "3.14159265358979 2.71828 -0.5 +7 1e-9 0x1F 0b1010",
    "1,000,000 and 1.000.000 and 1 000 000",
    "٠١٢٣٤٥٦٧٨٩ ۰۱۲۳ ０１２３ ⅠⅡⅫ ²³¹ ½¾ ①②",
    "😀",
    "😀😃😄😁",
    "👍🏽 👩🏾‍💻 🧑🏻‍🤝‍🧑🏿",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🇺🇸🇯🇵 flags, 1️⃣ keycap, ❤️ heart",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
    "e\u0301 a\u0308 n\u0303 combining, \u0301 lone mark",
    "\u0378\u0379 unassigned, \ue000\uf8ff private use, \U0010fffd plane 16",
    "\ufeffBOM at start",
    "null\x00byte",
    "\x01\x02\x1b[31mred\x1b[0m\x7f",
    "ℌ𝔢𝔩𝔩𝔬 𝐁𝐨𝐥𝐝 𝓈𝒸𝓇𝒾𝓅𝓉 ﬁ ﬂ ﬀ",
    "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ！",
    "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
    "' era",
    "'s 't 'll 'S 'T 'LL '' ' '",
    "!!!!!!",
    "...???!!!,,,;;;:::",
    "-- == ++ ** // \\\\ || && ~~ ^^ %% $$ ## @@",
    "https://example.com/path?query=1&b=2#frag user@example.org",
    "C:\\Users\\name\\file.txt /usr/local/bin",
    "a" * 100,
    "ab" * 300,
    "The " * 50,
    "word" + " " * 10 + "word" + "\t" * 3 + "word",
    "Mixed: English, Русский, 中文, العربية, हिन्दी, 😀 in one line.",
    "▁ already escaped ▁▁ spaces",
    "Ġ Ċ ĉ byte-level chars",
    "ìíîï ðñòó ÀÁÂÃ",
]


def fuzz_strings(n: int, seed: int = 1234) -> list[str]:
    """Random strings mixing scripts, whitespace, digits, emoji and special-token parts."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyz",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " " * 6 + "\n\t\r",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœ",
        "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
        "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
        "가나다라마바사아자차카타파하",
        "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
        "कखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसह",
        "กขฃคฅฆงจฉชซฌญฎฏฐฑฒณดตถทธนบปผฝพฟภมยรลวศษสหฬอฮ",
        "😀😂🤣😍🤔👍🏽🚀🔥✨❤️",
        "\u200d\ufe0f\u0301\u0308\u200b\u00a0\u3000",
        "<|>_/",
    ]
    pieces = ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<eos>", "'s", "'ll", "\n\n"]
    out = []
    for _ in range(n):
        length = rng.randint(1, 60)
        chars = []
        while len(chars) < length:
            if rng.random() < 0.05:
                chars.append(rng.choice(pieces))
            else:
                pool = rng.choice(pools)
                chars.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
        out.append("".join(chars))
    return out


INVALID_UTF8 = [
    b"\xff",
    b"abc\x80def",
    b"\xc3",
    b"\xc3(",
    b"\xe2\x82",
    b"\xe2\x82(abc",
    b"\xf0\x9f\x98",
    b"\xc0\x80 overlong nul",
    b"\xed\xa0\x80 surrogate \xed\xbf\xbf",
    b"\xfe\xfe\xff\xff",
    b"ok \xe4\xbd\xa0\xe5\xa5 cut",
    b"\x80\x81\x82 continuation only",
]


def long_texts() -> list[str]:
    """A few long inputs (kept moderate so fixtures stay small)."""
    rng = random.Random(99)
    words = ["alpha", "beta", "gamma", "δέλτα", "эпсилон", "字", "😀", "12345", "\n", "  "]
    return [
        " ".join(rng.choice(words) for _ in range(2000)),
        "x" * 5000,
        " " * 3000 + "end",
        "\n" * 1000 + "end",
        "你好" * 1500,
    ]
