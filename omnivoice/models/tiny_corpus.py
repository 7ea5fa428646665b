"""Training text for the tiny checkpoint's offline tokenizer (dialogue turns start their own lines)."""

CORPUS = """\
system: You are a helpful voice assistant. Answer the user briefly, kindly and clearly, in plain spoken
English.
user: Hello! Can you hear me? What is the weather like today in the city?
assistant: Hello, I can hear you well. Today it is sunny and warm in the city, with a light breeze from the
west and a few clouds in the late afternoon.
user: Thank you. Should I take an umbrella when I go out tonight?
assistant: There is a small chance of rain after nine o'clock, so a light umbrella would be a good idea if
you plan to stay out late.

The morning train left the station at seven, and the people on board read their papers, drank their coffee
and looked out at the green fields. A child by the window counted the cows, the horses and the old red
barns, and her father smiled and helped her write the numbers in a small blue notebook. When the train
reached the river, the sun came out from behind the hills and the water shone like silver.

To make a simple soup, cut two onions, three carrots and a few potatoes into small pieces. Warm some oil in
a large pot, add the onions and stir them for five minutes until they are soft. Then add the carrots, the
potatoes and enough water or stock to cover them. Let everything cook slowly for about twenty minutes, add
salt and pepper, and serve it hot with fresh bread. It is a warm and friendly meal for a cold winter
evening.

user: Could you tell me a short story about a dog and a cat who become friends?
assistant: Once upon a time, a small brown dog lived next to a quiet grey cat. At first they did not like
each other at all. One stormy night the cat was stuck in a tree, and the dog barked until the neighbours
came to help. From that day on, they shared the sunny spot in the garden and were the best of friends.
user: That is lovely. Now please tell me what time it is in London and in Tokyo.
assistant: I do not have a clock of my own, but if it is noon in London, it is eight or nine in the evening
in Tokyo, depending on the season.

Speech is made of sound waves that travel through the air. A microphone turns those waves into numbers, a
computer listens to the numbers and finds the words, and a speaker turns new numbers back into sound. A good
voice system must be quick, because people do not like to wait. It should start to speak while it is still
thinking, and it should stop at once when the person begins to talk again.

system: Keep every answer short. If you are not sure, say so and ask a question.
user: What is the capital of France, and how many people live there?
assistant: The capital of France is Paris. About two million people live in the city itself, and more than
ten million live in the wider region around it.
user: And what about Germany and Italy?
assistant: The capital of Germany is Berlin, and the capital of Italy is Rome. Both are old cities with many
museums, parks and famous buildings.

Music has rhythm, melody and harmony. The rhythm is the pattern of long and short notes, the melody is the
line of notes that you can sing, and the harmony is the group of notes that sound together. Some songs are
fast and happy, some are slow and sad, and the best ones make us want to dance, to sing, or simply to listen
in silence.

user: I would like to learn a new language. Where should I begin?
assistant: Begin with a few words and phrases that you will use every day, like greetings, numbers and
simple questions. Listen to the language often, speak it out loud, and practise a little every day rather
than a lot once a week.
user: Which language is the easiest for an English speaker?
assistant: Many English speakers find Spanish, Italian, Dutch or Norwegian easier to start with, because
they share many words and sounds with English.

The garden was quiet in the early morning. Birds sang in the tall trees, bees moved from flower to flower,
and the grass was still wet with dew. An old man walked slowly along the path with a cup of tea in his hand,
stopping now and then to look at the roses he had planted many years ago. He said that a garden, like a good
friend, gives back more than you put into it.

system: The user may speak or type. Reply in the same language as the user, and never read out long lists.
user: Please set a timer for ten minutes and remind me to call my mother.
assistant: Done. I have set a timer for ten minutes, and when it rings I will remind you to call your
mother.
user: Thanks, you are very helpful today.
assistant: You are welcome. I am always happy to help, so just ask whenever you need something.

Numbers help us measure the world: one, two, three, four, five, six, seven, eight, nine and ten. We use them
to count money, to tell the time, to read maps and to build houses, bridges and machines. In 1969 people
first walked on the moon, and in 2024 millions of people talk to their phones every single day.
"""
